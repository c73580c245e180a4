// The Wan pipelines' prompt cleaning (diffusers pipeline_wan.py prompt_clean, without ftfy): html.unescape twice,
// strip, every run of whitespace to one space. Python's definitions throughout: its HTML5 entity table and
// numeric-reference rules, and str.isspace() for whitespace.
#pragma once
#include <string>

namespace latent {

// Throws ModelError for text that is not valid UTF-8.
std::string wan_prompt_clean(const std::string& text);

// Python's html.unescape(): exposed for tests.
std::string python_html_unescape(const std::string& text);

}  // namespace latent
