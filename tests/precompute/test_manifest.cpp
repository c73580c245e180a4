// latent-precompute's bookkeeping without GStreamer: the CSV manifest read record by record (RFC 4180), clip file
// names, the split of rows between ranks, and the append-only index that makes a killed run resumable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "manifest.h"
#include "outputs.h"

using namespace latent::precompute;
namespace fs = std::filesystem;

namespace {

std::vector<std::vector<std::string>> records(const std::string& text, std::vector<std::string>* errors = nullptr) {
  std::istringstream in(text);
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> f;
  std::string error;
  while (read_csv_record(in, f, error)) {
    if (errors) errors->push_back(error);
    out.push_back(f);
  }
  return out;
}

std::vector<ManifestRow> rows(const std::string& text) {
  std::istringstream in(text);
  ManifestReader r(in, "/data");
  std::vector<ManifestRow> out;
  while (auto row = r.next()) out.push_back(*row);
  return out;
}

const ClipEntry& clip(const ManifestRow& r) { return std::get<ClipEntry>(r); }
const RowError& error(const ManifestRow& r) { return std::get<RowError>(r); }

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("precompute-" + std::to_string(getpid()) + "-" + name);
  fs::remove(p);
  return p;
}

}  // namespace

TEST(Csv, QuotedFieldsHoldCommasQuotesAndLineBreaks) {
  const auto r = records("a,\"b, c\",\"say \"\"hi\"\"\"\n\"two\nlines\",x,\r\nlast,,\"\"");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], (std::vector<std::string>{"a", "b, c", "say \"hi\""}));
  EXPECT_EQ(r[1], (std::vector<std::string>{"two\nlines", "x", ""}));  // CRLF ends the record
  EXPECT_EQ(r[2], (std::vector<std::string>{"last", "", ""}));         // no newline at the end
}

TEST(Csv, ABrokenRecordIsReportedAndTheNextOneReads) {
  std::vector<std::string> errors;
  const auto r = records("ok,1\nba\"d,2\n\"closed\"x,3\nfine,4\n\"never closed,5\n", &errors);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "a quote inside an unquoted field");
  EXPECT_EQ(errors[2], "text after a closing quote");
  EXPECT_EQ(errors[3], "");
  EXPECT_EQ(r[3], (std::vector<std::string>{"fine", "4"}));
  EXPECT_EQ(errors[4], "a quoted field is never closed");
}

TEST(Manifest, ReadsClipsAndResolvesRelativePaths) {
  const auto r = rows("path,caption,start,end,fps\nclips/a.mp4,\"a cat, running\",1.5,4,24\n/abs/b.mkv,,,,\n\n");
  ASSERT_EQ(r.size(), 2u);  // the blank line is not a row
  EXPECT_EQ(clip(r[0]).path, fs::path("/data/clips/a.mp4"));
  EXPECT_EQ(clip(r[0]).source, "clips/a.mp4");
  EXPECT_EQ(clip(r[0]).caption, "a cat, running");
  EXPECT_EQ(*clip(r[0]).start, 1.5);
  EXPECT_EQ(*clip(r[0]).end, 4.0);
  EXPECT_EQ(*clip(r[0]).fps, 24.0);
  EXPECT_EQ(clip(r[1]).path, fs::path("/abs/b.mkv"));
  EXPECT_FALSE(clip(r[1]).start.has_value());
  EXPECT_EQ(clip(r[1]).row, 1u);
}

TEST(Manifest, ColumnsInAnyOrderOthersIgnored) {
  const auto r = rows("\xEF\xBB\xBFid,caption,path\n7,hello,x.mp4\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(clip(r[0]).source, "x.mp4");
  EXPECT_EQ(clip(r[0]).caption, "hello");
}

TEST(Manifest, BadRowsAreErrorsOfThatRowOnly) {
  const auto r = rows(
      "path,caption,start,end\n"
      "a.mp4,x,1,2\n"
      "b.mp4,too,many,fields,here\n"
      ",empty path,,\n"
      "c.mp4,x,soon,\n"
      "d.mp4,x,5,2\n"
      "e.mp4,x,-1,\n"
      "f.mp4,x,,\n");
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(clip(r[0]).source, "a.mp4");
  EXPECT_EQ(error(r[1]).reason, "5 fields, the header has 4");
  EXPECT_EQ(error(r[2]).reason, "empty path");
  EXPECT_EQ(error(r[3]).reason, "column start: \"soon\" is not a number >= 0");
  EXPECT_EQ(error(r[4]).reason, "end is not after start");
  EXPECT_EQ(error(r[5]).reason, "column start: \"-1\" is not a number >= 0");
  EXPECT_EQ(clip(r[6]).source, "f.mp4");
  EXPECT_EQ(error(r[4]).row, 4u);
}

TEST(Manifest, AHeaderWithoutPathIsRefused) {
  EXPECT_THROW(rows(""), ManifestError);
  EXPECT_THROW(rows("file,caption\nx.mp4,y\n"), ManifestError);
  EXPECT_THROW(rows("path,path\nx,y\n"), ManifestError);
}

// A manifest is read as it streams: a row is available before the rest of the input exists.
TEST(Manifest, ReadsAsItStreams) {
  std::stringstream in;
  in << "path,caption\nfirst.mp4,a\n";
  ManifestReader r(in, "/m");
  auto first = r.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(clip(*first).source, "first.mp4");
  in.clear();
  in << "second.mp4,b\n";
  auto second = r.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(clip(*second).source, "second.mp4");
  EXPECT_FALSE(r.next().has_value());
}

TEST(Outputs, NamesAreStableAndDistinctPerRange) {
  ClipEntry a;
  a.source = "videos/My Clip (1).mp4";
  ClipEntry b = a;
  b.start = 2.0;
  ClipEntry c = a;
  c.row = 99;  // the row number does not name the clip: editing the manifest does not rename finished clips
  EXPECT_EQ(clip_file_name(a), clip_file_name(c));
  EXPECT_NE(clip_file_name(a), clip_file_name(b));
  EXPECT_EQ(clip_file_name(a).rfind("My_Clip__1_-", 0), 0u) << clip_file_name(a);
  EXPECT_EQ(clip_file_name(a).size(), std::string("My_Clip__1_-").size() + 16 + std::string(".safetensors").size());
}

TEST(Outputs, RanksShareTheRowsExactlyOnce) {
  for (uint64_t world : {1, 2, 3, 7}) {
    std::multiset<uint64_t> taken;
    for (uint64_t row = 0; row < 100; ++row) {
      ClipEntry e;
      e.row = row;
      for (uint64_t rank = 0; rank < world; ++rank)
        if (owned_by(e, rank, world)) taken.insert(row);
    }
    EXPECT_EQ(taken.size(), 100u) << world;
    for (uint64_t row = 0; row < 100; ++row) EXPECT_EQ(taken.count(row), 1u) << world;
  }
}

TEST(Outputs, AnIndexKilledMidLineResumesWhole) {
  const fs::path index = scratch("index.jsonl");
  {
    JsonLines log(index);
    log.append(R"({"latent_file":"a.safetensors","caption":"line\nbreak"})");
  }
  {
    std::ofstream torn(index, std::ios::app);
    torn << R"({"latent_file":"b.safet)";  // the process died here
  }
  EXPECT_EQ(finished_files(index), (std::unordered_set<std::string>{"a.safetensors"}));
  {
    JsonLines log(index);  // terminates the torn line before appending
    log.append(R"({"latent_file":"c.safetensors"})");
  }
  EXPECT_EQ(finished_files(index), (std::unordered_set<std::string>{"a.safetensors", "c.safetensors"}));
  EXPECT_TRUE(finished_files(scratch("missing.jsonl")).empty());
  fs::remove(index);
}

// One unclosed quote once read the rest of the manifest into one field: a record is bounded, reported as that
// row's error, and reading goes on at the next line break.
TEST(Csv, ARunawayQuotedFieldIsBounded) {
  std::string text = "ok,1\n\"never closed,";
  text += std::string(kMaxRecordBytes + 10, 'x');
  text += "\nnext,2\nlast,3\n";
  std::vector<std::string> errors;
  const auto r = records(text, &errors);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("longer than 1 MiB"), std::string::npos) << errors[1];
  EXPECT_TRUE(r[1].empty());
  EXPECT_EQ(r[2], (std::vector<std::string>{"next", "2"}));
  EXPECT_EQ(r[3], (std::vector<std::string>{"last", "3"}));

  std::string wide(kMaxRecordFields + 5, ',');
  errors.clear();
  const auto w = records(wide + "\nafter,4\n", &errors);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(errors[0].find("fields"), std::string::npos) << errors[0];
  EXPECT_EQ(w[1], (std::vector<std::string>{"after", "4"}));
  // At the bound, not past it: read whole.
  const std::string longest(kMaxRecordBytes - 1, 'y');
  EXPECT_EQ(records(longest + "\n")[0], std::vector<std::string>{longest});
}

TEST(Manifest, ARunawayQuoteIsAnErrorOfItsRow) {
  std::string text = "path,caption\na.mp4,\"no end";
  text += std::string(kMaxRecordBytes, 'c');
  text += "\nb.mp4,fine\n";
  const auto r = rows(text);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NE(error(r[0]).reason.find("1 MiB"), std::string::npos) << error(r[0]).reason;
  EXPECT_EQ(clip(r[1]).source, "b.mp4");
}

// The index and the latent files' metadata are JSON: a Latin-1 caption or path is refused when its row is read,
// before the clip is decoded and encoded.
TEST(Manifest, TextThatIsNotUtf8IsAnErrorOfItsRow) {
  const auto r = rows("path,caption\nlatin.mp4,caf\xE9\nn\xE9.mp4,ok\nutf8.mp4,caf\xC3\xA9\n");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_NE(error(r[0]).reason.find("the caption is not valid UTF-8 (byte 0xE9 at offset 3)"), std::string::npos)
      << error(r[0]).reason;
  EXPECT_NE(error(r[1]).reason.find("the path is not valid UTF-8"), std::string::npos) << error(r[1]).reason;
  EXPECT_EQ(clip(r[2]).caption, "caf\xC3\xA9");
}

// Caption datasets describe one clip several times: every caption is its own sample and file.
TEST(Outputs, EachCaptionOfAClipHasItsOwnFile) {
  ClipEntry a;
  a.source = "v.mp4";
  a.caption = "a dog runs";
  ClipEntry b = a;
  b.caption = "a brown dog on a beach";
  ClipEntry none = a;
  none.caption = "";
  EXPECT_NE(clip_file_name(a), clip_file_name(b));
  EXPECT_NE(clip_file_name(a), clip_file_name(none));
  ClipEntry again = a;
  again.row = 7;
  EXPECT_EQ(clip_file_name(a), clip_file_name(again));
  // Rows without a caption keep the names of earlier versions, so their folders still resume.
  ClipEntry plain;
  plain.source = "videos/My Clip (1).mp4";
  EXPECT_EQ(clip_file_name(plain), "My_Clip__1_-0649680faa1d531e.safetensors");
}

TEST(Outputs, OneProcessPerRankAndFolder) {
  const fs::path dir = scratch("lock");
  fs::create_directories(dir);
  {
    RankLock first(dir, 0);
    try {
      RankLock second(dir, 0);
      FAIL() << "a second lock of rank 0 was granted";
    } catch (const OutputError& e) {
      EXPECT_NE(std::string(e.what()).find("another latent-precompute of rank 0"), std::string::npos) << e.what();
    }
    RankLock other(dir, 1);  // another rank works beside it
  }
  RankLock again(dir, 0);  // released with its holder
  fs::remove_all(dir);
}

TEST(Outputs, AFolderKeepsTheSettingsItWasMadeWith) {
  const fs::path dir = scratch("settings");
  fs::create_directories(dir);
  const DatasetSettings s{{"model", "/m.safetensors"}, {"dtype", "float32"}, {"max_frames", "all"}};
  check_settings(dir, s);  // the first run records them
  EXPECT_TRUE(fs::exists(dir / "settings.json"));
  check_settings(dir, s);  // the same settings resume
  DatasetSettings other = s;
  other[1].second = "bfloat16";
  try {
    check_settings(dir, other);
    FAIL() << "other settings were accepted";
  } catch (const OutputError& e) {
    EXPECT_NE(std::string(e.what()).find("dtype float32; this run asks for dtype bfloat16"), std::string::npos)
        << e.what();
  }
  for (const auto& d : fs::directory_iterator(dir)) EXPECT_EQ(d.path().filename(), "settings.json");
  fs::remove_all(dir);
}

TEST(Outputs, EveryRanksIndexCountsAsDone) {
  const fs::path dir = scratch("indexes");
  fs::create_directories(dir);
  JsonLines(dir / "index.jsonl").append(R"({"latent_file":"old.safetensors"})");
  JsonLines(rank_index(dir, 0)).append(R"({"latent_file":"zero.safetensors"})");
  JsonLines(rank_index(dir, 3)).append(R"({"latent_file":"three.safetensors"})");
  JsonLines(rank_errors(dir, 0)).append(R"({"latent_file":"failed.safetensors"})");
  EXPECT_EQ(rank_index(dir, 3).filename(), "index-rank3.jsonl");
  EXPECT_EQ(finished_in(dir),
            (std::unordered_set<std::string>{"old.safetensors", "zero.safetensors", "three.safetensors"}));
  fs::remove_all(dir);
}

// A full disk (here /dev/full) is an error the caller can report, never a half line followed by more.
TEST(Outputs, AFullDiskIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path dir = scratch("full");
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir / "index.jsonl");
  JsonLines log(dir / "index.jsonl");
  try {
    log.append(R"({"latent_file":"a.safetensors"})");
    FAIL() << "the append to a full device succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

namespace {

// A launcher's environment, without touching the process's.
LaunchRank launched(std::map<std::string, std::string> vars) {
  return launch_rank([vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::vector<uint64_t> shard(const LaunchRank& l, uint64_t rows) {
  std::vector<uint64_t> out;
  for (uint64_t row = 0; row < rows; ++row) {
    ClipEntry e;
    e.row = row;
    if (owned_by(e, l.rank, l.world)) out.push_back(row);
  }
  return out;
}

std::string launch_error(std::map<std::string, std::string> vars) {
  try {
    launched(std::move(vars));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Launch, SlurmTasksTakeTheShardsOfTheSameTorchrunRanks) {
  for (uint64_t world : {1, 2, 5}) {
    for (uint64_t rank = 0; rank < world; ++rank) {
      const LaunchRank slurm = launched({{"SLURM_PROCID", std::to_string(rank)},
                                         {"SLURM_NTASKS", std::to_string(world)},
                                         {"SLURM_LOCALID", std::to_string(rank % 2)}});
      const LaunchRank torchrun = launched({{"RANK", std::to_string(rank)},
                                            {"WORLD_SIZE", std::to_string(world)},
                                            {"LOCAL_RANK", std::to_string(rank % 2)}});
      EXPECT_EQ(slurm.rank, torchrun.rank);
      EXPECT_EQ(slurm.world, torchrun.world);
      EXPECT_EQ(slurm.local_rank, torchrun.local_rank);
      EXPECT_EQ(shard(slurm, 23), shard(torchrun, 23)) << rank << "/" << world;
    }
  }
  const LaunchRank none = launched({});
  EXPECT_EQ(none.rank, 0u);
  EXPECT_EQ(none.world, 1u);
  EXPECT_FALSE(none.local_rank);
  // A batch script run without -n: task 0 and no task count.
  EXPECT_EQ(launched({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}).world, 1u);
}

TEST(Launch, TorchrunWinsOverTheSlurmJobAroundIt) {
  const LaunchRank l = launched({{"RANK", "3"},
                                 {"WORLD_SIZE", "8"},
                                 {"LOCAL_RANK", "1"},
                                 {"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "2"},
                                 {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(l.rank, 3u);
  EXPECT_EQ(l.world, 8u);
  EXPECT_EQ(l.local_rank, 1u);
  EXPECT_EQ(l.source, "$RANK/$WORLD_SIZE");
}

TEST(Launch, AJobArrayOfTasksCoversEveryRowOnce) {
  // --array=4-12:4 (ids 4, 8, 12) of 2 tasks each: 6 ranks.
  std::multiset<uint64_t> taken;
  std::set<uint64_t> ranks;
  for (uint64_t id : {4, 8, 12}) {
    for (uint64_t task = 0; task < 2; ++task) {
      const LaunchRank l = launched({{"SLURM_ARRAY_TASK_ID", std::to_string(id)},
                                     {"SLURM_ARRAY_TASK_MIN", "4"},
                                     {"SLURM_ARRAY_TASK_MAX", "12"},
                                     {"SLURM_ARRAY_TASK_STEP", "4"},
                                     {"SLURM_ARRAY_TASK_COUNT", "3"},
                                     {"SLURM_PROCID", std::to_string(task)},
                                     {"SLURM_NTASKS", "2"}});
      EXPECT_EQ(l.world, 6u);
      ranks.insert(l.rank);
      for (uint64_t row : shard(l, 50)) taken.insert(row);
    }
  }
  EXPECT_EQ(ranks.size(), 6u);
  EXPECT_EQ(taken.size(), 50u);
  for (uint64_t row = 0; row < 50; ++row) EXPECT_EQ(taken.count(row), 1u) << row;
  // One task per array job, the usual case: the array index is the rank.
  const LaunchRank one = launched({{"SLURM_ARRAY_TASK_ID", "7"},
                                   {"SLURM_ARRAY_TASK_MIN", "0"},
                                   {"SLURM_ARRAY_TASK_MAX", "9"},
                                   {"SLURM_ARRAY_TASK_COUNT", "10"},
                                   {"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(one.rank, 7u);
  EXPECT_EQ(one.world, 10u);
}

TEST(Launch, MalformedValuesAreClearErrors) {
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "'" << text << "' lacks '" << part << "'";
  };
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "4"}}),
                  "$SLURM_PROCID=\"x1\" is not a non-negative integer"));
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "-4"}}),
                  "$SLURM_NTASKS=\"-4\" is not a non-negative integer"));
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4 "}}), "$SLURM_NTASKS=\"4 \""));
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
                  "$SLURM_PROCID=4 is not below $SLURM_NTASKS=4"));
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}), "$SLURM_NTASKS=0"));
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "2"}}), "$SLURM_PROCID=2 is set without $SLURM_NTASKS"));
  // An salloc shell: the allocation's task count, and this shell is no task of it.
  EXPECT_EQ(launched({{"SLURM_NTASKS", "2"}}).world, 1u);
  EXPECT_TRUE(has(launch_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "zero"}}),
                  "$SLURM_LOCALID=\"zero\""));
  EXPECT_TRUE(has(launch_error({{"SLURM_ARRAY_TASK_ID", "3"},
                                {"SLURM_ARRAY_TASK_MIN", "1"},
                                {"SLURM_ARRAY_TASK_MAX", "9"},
                                {"SLURM_ARRAY_TASK_COUNT", "3"}}),
                  "are not one evenly spaced range"));
  EXPECT_TRUE(has(launch_error({{"SLURM_ARRAY_TASK_ID", "3"}}), "is set without $SLURM_ARRAY_TASK_MIN"));
  // torchrun's own are checked the same way.
  EXPECT_TRUE(has(launch_error({{"RANK", "1"}}), "$RANK=1 is set without $WORLD_SIZE"));
  EXPECT_TRUE(has(launch_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), "$RANK=\"one\""));
}

TEST(Launch, EachLocalRankTakesItsOwnGpu) {
  EXPECT_EQ(local_gpu(0, 4), 0);
  EXPECT_EQ(local_gpu(3, 4), 3);
  EXPECT_EQ(local_gpu(3, 1), 0);  // the launcher gave the process one GPU of its own
  EXPECT_THROW(local_gpu(4, 4), std::invalid_argument);
  EXPECT_THROW(local_gpu(1, 0), std::invalid_argument);
}
