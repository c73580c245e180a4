// The family table (core/src/vae/families.cpp): every family is recognised by its config class, by the "family"
// key of __metadata__ and by its tensor names, and says how it cuts time.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <map>
#include <set>
#include <string>

#include "vae/families.h"

using namespace latent;

namespace {

WeightSource with_tensors(std::initializer_list<const char*> names) {
  WeightSource src;
  src.weights = "/models/test.safetensors";
  for (const char* n : names) src.tensors.emplace(n, torch::zeros({1}));
  return src;
}

std::string refusal(WeightSource src) {
  try {
    detect_family(src);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Families, RowsAreCompleteAndDistinct) {
  std::set<std::string> names;
  std::map<std::string, int> rows_of_class;
  for (const Family& f : families()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    ++rows_of_class[f.config_class];
    EXPECT_NE(f.recognise, nullptr);
    EXPECT_NE(f.make, nullptr);
    EXPECT_NE(f.chunks, nullptr);
  }
  // A class shared by several rows needs every one of them to say which configs are its own.
  for (const Family& f : families())
    if (rows_of_class[f.config_class] > 1) EXPECT_NE(f.takes_config, nullptr) << f.name;
  EXPECT_EQ(names, (std::set<std::string>{"wan2.1", "wan2.2", "cogvideox", "taehv"}));
}

TEST(Families, ConfigClassDecides) {
  for (const Family& f : families()) {
    WeightSource src = with_tensors({"encoder.conv_in.conv.weight"});  // CogVideoX names: the class wins
    // Wan 2.1 and 2.2 share AutoencoderKLWan; is_residual tells them apart.
    src.config = ModelConfig{f.config_class, std::string(f.name) == "wan2.2" ? R"({"is_residual": true})" : "{}"};
    EXPECT_STREQ(detect_family(src).name, f.name);
  }
  WeightSource src;
  src.config = ModelConfig{"AutoencoderKLMochi", "{}"};
  const std::string msg = refusal(src);
  EXPECT_NE(
      msg.find(
          "'AutoencoderKLMochi' is not a supported VAE (supported: AutoencoderKLWan, AutoencoderKLCogVideoX, TAEHV)"),
      std::string::npos)
      << msg;
}

TEST(Families, MetadataFamilyDecidesWithoutAConfig) {
  for (const Family& f : families()) {
    WeightSource src;
    src.metadata["family"] = f.name;
    EXPECT_STREQ(detect_family(src).name, f.name);
  }
  WeightSource src;
  src.metadata["family"] = "ltx";
  EXPECT_NE(
      refusal(src).find("unknown model family 'ltx' in __metadata__ (supported: wan2.1, wan2.2, cogvideox, taehv)"),
      std::string::npos);
}

TEST(Families, TensorNamesDecideLast) {
  WeightSource wan = with_tensors({"encoder.conv_in.weight", "encoder.down_blocks.0.norm1.gamma"});
  EXPECT_STREQ(detect_family(wan).name, "wan2.1");
  WeightSource cog = with_tensors({"encoder.conv_in.conv.weight"});
  EXPECT_STREQ(detect_family(cog).name, "cogvideox");
  // The original Wan 2.1 checkpoint is recognised and renamed to the names the constructor reads.
  WeightSource original =
      with_tensors({"encoder.conv1.weight", "encoder.downsamples.0.residual.0.gamma", "conv2.bias"});
  EXPECT_STREQ(detect_family(original).name, "wan2.1");
  EXPECT_TRUE(original.tensors.count("encoder.conv_in.weight"));
  EXPECT_TRUE(original.tensors.count("encoder.down_blocks.0.norm1.gamma"));
  EXPECT_TRUE(original.tensors.count("post_quant_conv.bias"));
  WeightSource wan22 = with_tensors({"encoder.conv_in.weight", "encoder.down_blocks.0.resnets.0.norm1.gamma"});
  EXPECT_STREQ(detect_family(wan22).name, "wan2.2");
  // The original Wan 2.2 checkpoint nests each level's blocks; its resamplers become downsampler/upsampler.
  WeightSource original22 = with_tensors(
      {"encoder.conv1.weight", "encoder.downsamples.0.downsamples.0.residual.0.gamma",
       "encoder.downsamples.0.downsamples.2.resample.1.weight", "decoder.upsamples.1.upsamples.0.shortcut.weight",
       "decoder.upsamples.0.upsamples.3.time_conv.bias", "decoder.head.2.bias"});
  EXPECT_STREQ(detect_family(original22).name, "wan2.2");
  for (const char* name :
       {"encoder.conv_in.weight", "encoder.down_blocks.0.resnets.0.norm1.gamma",
        "encoder.down_blocks.0.downsampler.resample.1.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight",
        "decoder.up_blocks.0.upsampler.time_conv.bias", "decoder.conv_out.bias"})
    EXPECT_TRUE(original22.tensors.count(name)) << name;
  // TAEHV's Sequential indices, whole or one half of it.
  WeightSource taehv = with_tensors({"encoder.0.weight", "encoder.17.weight", "decoder.1.weight"});
  EXPECT_STREQ(detect_family(taehv).name, "taehv");
  WeightSource taehv_decoder = with_tensors({"decoder.0.weight", "decoder.22.weight"});
  EXPECT_STREQ(detect_family(taehv_decoder).name, "taehv");
  const std::string msg = refusal(with_tensors({"unet.conv_in.weight"}));
  EXPECT_NE(msg.find("/models/test.safetensors: cannot recognise the model family"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unet.conv_in.weight"), std::string::npos) << msg;
}

TEST(Families, ChunkRules) {
  const ChunkRules wan = wan_chunks(4);
  EXPECT_EQ(wan.encode.first, 1);
  EXPECT_EQ(wan.encode.step, 4);
  EXPECT_TRUE(wan.encode.batchable);
  EXPECT_EQ(wan.decode.first, 1);
  EXPECT_EQ(wan.decode.step, 1);
  const ChunkRules cog = cogvideox_chunks(4);
  EXPECT_EQ(cog.encode.first, 9);
  EXPECT_EQ(cog.encode.step, 8);
  EXPECT_FALSE(cog.encode.batchable);
  EXPECT_EQ(cog.decode.first, 3);
  EXPECT_EQ(cog.decode.step, 2);
  EXPECT_FALSE(cog.decode.batchable);
  // No lone first frame: every chunk, the first too, is whole groups of 4.
  const ChunkRules taehv = taehv_chunks(4);
  EXPECT_EQ(taehv.encode.first, 4);
  EXPECT_EQ(taehv.encode.step, 4);
  EXPECT_TRUE(taehv.encode.batchable);
  EXPECT_EQ(taehv.decode.first, 1);
  EXPECT_EQ(taehv.decode.step, 1);
}
