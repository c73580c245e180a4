// The Wan pipelines' prompt cleaning (diffusers pipeline_wan.py prompt_clean with ftfy installed, as the Wan
// pipelines are run): ftfy.fix_text, html.unescape twice, strip, every run of whitespace to one space. Python's
// definitions throughout: its HTML5 entity table and numeric-reference rules, str.isspace() for whitespace,
// unicodedata's NFC, and ftfy's own character maps (tools/gen_ftfy_tables.py).
#pragma once
#include <string>

namespace latent {

// Throws ModelError for text that is not valid UTF-8.
std::string wan_prompt_clean(const std::string& text);

// Python's html.unescape(): exposed for tests.
std::string python_html_unescape(const std::string& text);

// ftfy.fix_text(text) with ftfy's default configuration (ftfy 6.3). Throws ModelError for text that is not valid
// UTF-8.
std::string ftfy_fix_text(const std::string& text);

}  // namespace latent
