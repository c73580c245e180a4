// The Wan pipelines' prompt cleaning (diffusers pipeline_wan.py prompt_clean with ftfy installed, as the Wan
// pipelines are run): ftfy.fix_text, html.unescape twice, strip, every run of whitespace to one space. Python's
// definitions throughout: its HTML5 entity table and numeric-reference rules, str.isspace() for whitespace,
// unicodedata's NFC, and ftfy's own character maps (tools/gen_ftfy_tables.py).
#pragma once
#include <string>

#include "gen/text/t5_tokenizer.h"

namespace latent {

// Throws ModelError for text that is not valid UTF-8.
std::string wan_prompt_clean(const std::string& text);

// wan_prompt_clean(text) read from no more than its first max_bytes bytes, as a PrefixReader: the cleaning of the
// whole lines (ftfy's segments: lines, and every million code points of a longer one) within them, up to the last
// space, tab or line break after ftfy (which no html reference spans), so the result is exactly the start of the
// whole text's cleaning, followed there by a space. The whole text is still checked to be UTF-8.
TokenizerInputPrefix wan_prompt_clean_prefix(const std::string& text, size_t max_bytes);

// Python's html.unescape(): exposed for tests.
std::string python_html_unescape(const std::string& text);

// ftfy.fix_text(text) with ftfy's default configuration (ftfy 6.3). Throws ModelError for text that is not valid
// UTF-8.
std::string ftfy_fix_text(const std::string& text);

}  // namespace latent
