// The videorestyle tests, run by gst-causal-tests beside videogen's causal schedule (one program: both load the same
// tiny causal model).
#pragma once

#include <gst/check/gstcheck.h>

void add_restyle_tests(Suite* s);
