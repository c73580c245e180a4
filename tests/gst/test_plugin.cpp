// The plugin as GStreamer sees it: found from the build tree, loadable without a GPU, with the metadata and
// element set the project documents.
#include <gst/check/gstcheck.h>

#include <set>
#include <string>

static const std::set<std::string> kElements = {
    // Every element of the plugin; a new element is registered in plugin.cpp and listed here.
    "latentfilesink", "latentfilesrc", "vaedecode", "vaeencode", "videogen", "videorestyle",
};

GST_START_TEST(test_plugin_loads_from_build_tree) {
  GstPlugin* plugin = gst_registry_find_plugin(gst_registry_get(), "latent");
  fail_unless(plugin != nullptr, "plugin 'latent' not found; GST_PLUGIN_PATH=%s", g_getenv("GST_PLUGIN_PATH_1_0"));
  GstPlugin* loaded = gst_plugin_load(plugin);
  fail_unless(loaded != nullptr, "plugin 'latent' failed to load");
  fail_unless_equals_string(gst_plugin_get_version(loaded), LATENT_TEST_VERSION);
  fail_unless_equals_string(gst_plugin_get_license(loaded), "LGPL");
  fail_unless(g_str_has_prefix(gst_plugin_get_filename(loaded), LATENT_TEST_PLUGIN_DIR),
              "loaded %s, not the build tree's plugin", gst_plugin_get_filename(loaded));
  gst_object_unref(loaded);
  gst_object_unref(plugin);
}
GST_END_TEST;

GST_START_TEST(test_plugin_registers_documented_elements) {
  GList* features = gst_registry_get_feature_list_by_plugin(gst_registry_get(), "latent");
  std::set<std::string> found;
  for (GList* l = features; l; l = l->next) found.insert(gst_plugin_feature_get_name(GST_PLUGIN_FEATURE(l->data)));
  gst_plugin_feature_list_free(features);
  fail_unless(found == kElements, "plugin registers %zu features, %zu expected", found.size(), kElements.size());
}
GST_END_TEST;

static Suite* plugin_suite() {
  Suite* s = suite_create("latent-plugin");
  TCase* tc = tcase_create("plugin");
  suite_add_tcase(s, tc);
  tcase_add_test(tc, test_plugin_loads_from_build_tree);
  tcase_add_test(tc, test_plugin_registers_documented_elements);
  return s;
}

GST_CHECK_MAIN(plugin);
