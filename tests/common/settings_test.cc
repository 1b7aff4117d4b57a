// Unit tests of the PHANTOM_* settings parser (device/common): one rule per
// test — whitespace, empty values, case, units, overflow, ranges, signs and
// fractions, switches, option lists — and the one sentence shape of every
// refusal. The reading sites (fake driver, runtime, Python) are tested in
// their own suites; here every spelling is checked without a process each.
#include <phantom/common/settings.h>

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

namespace phantom::settings {
namespace {

// Parses `text` as `spec`; the value on success, the error in *error.
bool Accepts(const Spec& spec, const char* text, Value* value = nullptr,
             std::string* error = nullptr) {
  Value local;
  std::string local_error;
  return Parse(spec, text, value != nullptr ? value : &local,
               error != nullptr ? error : &local_error);
}

uint64_t NumberOf(const Spec& spec, const char* text) {
  Value value;
  std::string error;
  EXPECT_TRUE(Parse(spec, text, &value, &error)) << text << ": " << error;
  return value.number;
}

std::string ErrorOf(const Spec& spec, const char* text) {
  Value value;
  std::string error;
  EXPECT_FALSE(Parse(spec, text, &value, &error)) << "accepted '" << text << "'";
  return error;
}

// A value of each kind that no setting of that kind accepts.
const char* BadValueFor(Kind kind) {
  switch (kind) {
    case Kind::kCount: return "abc";
    case Kind::kSize: return "lots";
    case Kind::kSwitch: return "true";
    case Kind::kFraction: return "half";
    case Kind::kOptions: return "bogus";
    case Kind::kLibrary: return "drivers/";
    case Kind::kChoice: return "sometimes";
  }
  return nullptr;
}

TEST(SettingsCatalogue, NamesAreUniquePhantomVariablesAndFindable) {
  std::set<std::string> names;
  for (const Spec* spec : kAll) {
    EXPECT_EQ(std::string(spec->name).rfind("PHANTOM_", 0), 0u) << spec->name;
    EXPECT_TRUE(names.insert(spec->name).second) << spec->name;
    EXPECT_EQ(Find(spec->name), spec);
  }
  EXPECT_EQ(Find("PHANTOM_NOT_A_SETTING"), nullptr);
  EXPECT_EQ(Find("max_split_size_mb"), nullptr);  // an option, not a variable
}

TEST(SettingsCatalogue, UnsetGivesTheDefaultAndTheDefaultTextSaysIt) {
  for (const Spec* spec : kAll) {
    Value value;
    std::string error;
    ASSERT_TRUE(Parse(*spec, nullptr, &value, &error)) << spec->name;
    EXPECT_FALSE(value.set);
    EXPECT_EQ(value.number, spec->default_number) << spec->name;
  }
  // Where the default is a value, its text parses to it.
  EXPECT_EQ(NumberOf(kDeviceCount, kDeviceCount.default_text), 2u);
  EXPECT_EQ(NumberOf(kDeviceMemory, kDeviceMemory.default_text), 8 * kGiB);
  EXPECT_EQ(NumberOf(kFaultLatencyUs, kFaultLatencyUs.default_text), 0u);
}

TEST(SettingsRules, EmptyOrBlankCountsAsUnset) {
  for (const Spec* spec : kAll) {
    for (const char* text : {"", " ", "\t\n "}) {
      Value value;
      value.set = true;
      std::string error;
      ASSERT_TRUE(Parse(*spec, text, &value, &error)) << spec->name << error;
      EXPECT_FALSE(value.set) << spec->name;
      EXPECT_EQ(value.number, spec->default_number) << spec->name;
    }
  }
}

TEST(SettingsRules, WhitespaceAroundAValueIsIgnoredEverywhere) {
  EXPECT_EQ(NumberOf(kDeviceCount, " 3"), 3u);
  EXPECT_EQ(NumberOf(kDeviceCount, "3\t\n"), 3u);
  EXPECT_EQ(NumberOf(kFaultKernel, " 5 "), 5u);
  EXPECT_EQ(NumberOf(kDeviceMemory, "  512MiB "), 512 * kMiB);
  EXPECT_EQ(NumberOf(kSyncGeneric, " 1 "), 1u);
  Value value;
  ASSERT_TRUE(Accepts(kAllocConf,
                      " max_split_size_mb : 64 ,\tgarbage_collection_threshold: 0.5 ",
                      &value));
  ASSERT_NE(value.option(kMaxSplitSizeMb), nullptr);
  EXPECT_EQ(value.option(kMaxSplitSizeMb)->number, 64u);
  EXPECT_DOUBLE_EQ(value.option(kGarbageCollectionThreshold)->fraction, 0.5);
}

TEST(SettingsRules, WhitespaceBetweenANumberAndItsUnitIsIgnoredButNotInside) {
  EXPECT_EQ(NumberOf(kDeviceMemory, "4 GiB"), 4 * kGiB);
  EXPECT_EQ(NumberOf(kDeviceMemory, "4\tG"), 4 * kGiB);
  for (const char* text : {"1 6MiB", "4 G B", "4G iB"}) {
    ErrorOf(kDeviceMemory, text);
  }
  ErrorOf(kDeviceCount, "1 0");
  ErrorOf(kSyncGeneric, "1 1");
  ErrorOf(kAllocConf, "max_split_size_mb:6 4");
}

TEST(SettingsRules, SizeUnitsArePowersOf1024InAnyCaseAndSpelling) {
  const std::pair<const char*, uint64_t> valid[] = {
      {"1048576", kMiB},   {"1048576B", kMiB}, {"1048576b", kMiB},
      {"1024K", kMiB},     {"1024k", kMiB},    {"1024KiB", kMiB},
      {"1024kib", kMiB},   {"1024KB", kMiB},   {"1M", kMiB},
      {"2047KiB", 2047 * kKiB}, {"512MiB", 512 * kMiB},
      {"4G", 4 * kGiB},    {"4g", 4 * kGiB},   {"4GB", 4 * kGiB},
      {"4gb", 4 * kGiB},   {"4GIB", 4 * kGiB}, {"4gIb", 4 * kGiB},
      {"1T", kTiB},        {"1TiB", kTiB},     {"007G", 7 * kGiB}};
  for (auto [text, expected] : valid) {
    EXPECT_EQ(NumberOf(kDeviceMemory, text), expected) << text;
  }
  for (const char* text : {"4X", "4GiBs", "4iB", "4Gi", "4KK", "4P", "4GiB!",
                           "G", "GiB", "4.5G", "1e9"}) {
    EXPECT_NE(ErrorOf(kDeviceMemory, text).find("is not a size"),
              std::string::npos) << text;
  }
  EXPECT_NE(ErrorOf(kDeviceMemory, "4X").find("is not a size: 'X' is not a unit"),
            std::string::npos);
}

TEST(SettingsRules, LettersInOptionNamesAreMatchedIgnoringCase) {
  Value value;
  ASSERT_TRUE(Accepts(kAllocConf, "MAX_SPLIT_SIZE_MB:64,Garbage_Collection_Threshold:0.25",
                      &value));
  EXPECT_EQ(value.option(kMaxSplitSizeMb)->number, 64u);
  EXPECT_DOUBLE_EQ(value.option(kGarbageCollectionThreshold)->fraction, 0.25);
}

TEST(SettingsRules, RangesAreInclusiveAndEnforced) {
  EXPECT_EQ(NumberOf(kDeviceCount, "0"), 0u);
  EXPECT_EQ(NumberOf(kDeviceCount, "64"), 64u);
  EXPECT_EQ(NumberOf(kDeviceCount, "064"), 64u);
  EXPECT_NE(ErrorOf(kDeviceCount, "65").find("is not in range: larger than 64"),
            std::string::npos);
  EXPECT_EQ(NumberOf(kDeviceMemory, "1MiB"), kMiB);
  EXPECT_EQ(NumberOf(kDeviceMemory, "1TiB"), kTiB);
  EXPECT_NE(ErrorOf(kDeviceMemory, "1048575").find(
                "is not in range: smaller than 1MiB"), std::string::npos);
  EXPECT_NE(ErrorOf(kDeviceMemory, "1023K").find("smaller than 1MiB"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kDeviceMemory, "1099511627777").find(
                "is not in range: larger than 1TiB"), std::string::npos);
  EXPECT_NE(ErrorOf(kDeviceMemory, "0").find("smaller than 1MiB"),
            std::string::npos);
  EXPECT_EQ(NumberOf(kFaultLatencyUs, "10000000"), 10'000'000u);
  ErrorOf(kFaultLatencyUs, "10000001");
  EXPECT_NE(ErrorOf(kFaultAlloc, "0").find("is not in range: smaller than 1"),
            std::string::npos);
  EXPECT_EQ(NumberOf(kFaultAlloc, "9223372036854775807"), kUnbounded);
  Value value;
  EXPECT_TRUE(Accepts(kAllocConf, "max_split_size_mb:21", &value));
  EXPECT_TRUE(Accepts(kAllocConf, "max_split_size_mb:1048576"));
  EXPECT_FALSE(Accepts(kAllocConf, "max_split_size_mb:20"));
  EXPECT_FALSE(Accepts(kAllocConf, "max_split_size_mb:1048577"));
  EXPECT_TRUE(Accepts(kAllocConf, "record_memory_history:1", &value));
  EXPECT_EQ(value.option(kRecordMemoryHistory)->number, 1u);
  EXPECT_FALSE(Accepts(kAllocConf, "record_memory_history:0"));
}

TEST(SettingsRules, OverflowingNumbersAreRefusedNeverWrapped) {
  // Each of these wraps to a small or valid number in 64-bit arithmetic.
  for (const char* text : {"99999999999999999999", "18446744073709551616",
                           "18446744073709551617"}) {
    EXPECT_NE(ErrorOf(kDeviceCount, text).find("larger than 64"),
              std::string::npos) << text;
    EXPECT_NE(ErrorOf(kFaultAlloc, text).find("larger than"),
              std::string::npos) << text;
  }
  ErrorOf(kFaultKernel, "9223372036854775808");  // INT64_MAX + 1
  for (const char* text : {"99999999999999999999T", "18014398509481984K",
                           "16777216T", "17592186044416M", "16777215T"}) {
    EXPECT_NE(ErrorOf(kDeviceMemory, text).find("larger than 1TiB"),
              std::string::npos) << text;
  }
  EXPECT_NE(ErrorOf(kAllocConf, "max_split_size_mb:99999999999999999999")
                .find("max_split_size_mb='99999999999999999999' is not in "
                      "range: larger than 1048576"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kAllocConf, "max_split_size_mb:17592186044416").find(
                "larger than 1048576"), std::string::npos);
}

TEST(SettingsRules, NumbersAreWholeDecimalAndUnsigned) {
  for (const char* text : {"-1", "+2", "1.5", "1e3", "0x10", "two", "2x", "--"}) {
    EXPECT_NE(ErrorOf(kDeviceCount, text).find("is not a whole number;"),
              std::string::npos) << text;
  }
}

TEST(SettingsRules, SwitchesAreZeroOrOne) {
  EXPECT_EQ(NumberOf(kSyncGeneric, "0"), 0u);
  EXPECT_EQ(NumberOf(kSyncGeneric, "1"), 1u);
  EXPECT_EQ(NumberOf(kSyncGeneric, "01"), 1u);  // a number, like "064"
  for (const char* text : {"true", "false", "yes", "on", "2", "-1", "1.0",
                           "99999999999999999999"}) {
    EXPECT_NE(ErrorOf(kNoLending, text).find("is not 0 or 1;"), std::string::npos)
        << text;
  }
}

TEST(SettingsRules, FractionsAreStrictlyBetweenZeroAndOne) {
  Value value;
  for (auto [text, expected] : {std::pair{"0.5", 0.5}, {".25", 0.25},
                                {"00.75", 0.75}, {"0.999", 0.999}}) {
    const std::string conf = std::string("garbage_collection_threshold:") + text;
    ASSERT_TRUE(Accepts(kAllocConf, conf.c_str(), &value)) << text;
    EXPECT_DOUBLE_EQ(value.option(kGarbageCollectionThreshold)->fraction, expected);
  }
  for (const char* text : {"0", "0.0", "0.", "1", "1.0", "1.5", "2", "-0.5",
                           "0.5.1", "1e-1", ".", "half", ""}) {
    const std::string conf = std::string("garbage_collection_threshold:") + text;
    EXPECT_FALSE(Accepts(kAllocConf, conf.c_str())) << text;
  }
}

TEST(SettingsRules, OptionListsNameKnownOptionsOnceWithAValue) {
  Value value;
  ASSERT_TRUE(Accepts(kAllocConf, "max_split_size_mb:64,", &value));  // trailing comma
  ASSERT_TRUE(Accepts(kAllocConf, ",,max_split_size_mb:64,,", &value));
  EXPECT_EQ(value.options.size(), 1u);
  EXPECT_EQ(value.option(kGarbageCollectionThreshold), nullptr);
  EXPECT_NE(ErrorOf(kAllocConf, "bogus").find(
                "is not a list of key:value options: 'bogus' has no ':'"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kAllocConf, "foo:1").find(
                "is not a list of known options: 'foo' is not an option"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kAllocConf, "max_split_size_mb:64,MAX_SPLIT_SIZE_MB:128")
                .find("max_split_size_mb is given twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kAllocConf, "max_split_size_mb:").find(
                "max_split_size_mb='' is not a whole number"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kAllocConf, "max_split_size_mb:lots").find(
                "max_split_size_mb='lots' is not a whole number"),
            std::string::npos);
}

TEST(SettingsSentence, EveryRefusalHasTheOneShape) {
  const std::regex shape(
      "PHANTOM_[A-Z_]+='[^']*' is not [^;]+; accepted: [^;]+; unset it for the "
      "default [^;]+");
  for (const Spec* spec : kAll) {
    const char* bad = BadValueFor(spec->kind);
    ASSERT_NE(bad, nullptr) << spec->name;
    const std::string error = ErrorOf(*spec, bad);
    EXPECT_TRUE(std::regex_match(error, shape)) << error;
    EXPECT_EQ(error.rfind(std::string(spec->name) + "='" + bad + "' is not ", 0), 0u)
        << error;
    EXPECT_NE(error.find("; accepted: " + Accepted(*spec) + ";"), std::string::npos)
        << error;
    EXPECT_NE(error.find(std::string("unset it for the default ") +
                         spec->default_text),
              std::string::npos) << error;
  }
}

TEST(SettingsSentence, ExactWording) {
  EXPECT_EQ(ErrorOf(kDeviceCount, "abc"),
            "PHANTOM_DEVICE_COUNT='abc' is not a whole number; accepted: a "
            "whole number from 0 to 64; unset it for the default 2");
  EXPECT_EQ(ErrorOf(kSyncGeneric, "true"),
            "PHANTOM_SYNC_GENERIC='true' is not 0 or 1; accepted: 1 (on) or 0 "
            "(off); unset it for the default 0 (off)");
  EXPECT_EQ(ErrorOf(kFaultAlloc, "0"),
            "PHANTOM_FAULT_ALLOC='0' is not in range: smaller than 1; "
            "accepted: a whole number, 1 or more; unset it for the default (off)");
  EXPECT_EQ(ErrorOf(kFaultLatencyUs, "20000000"),
            "PHANTOM_FAULT_LATENCY_US='20000000' is not in range: larger than "
            "10000000; accepted: a whole number of microseconds from 0 to "
            "10000000; unset it for the default 0");
  EXPECT_EQ(ErrorOf(kDeviceMemory, "512KiB"),
            "PHANTOM_DEVICE_MEMORY='512KiB' is not in range: smaller than 1MiB; "
            "accepted: a size from 1MiB to 1TiB, in bytes or with a unit K, M, G "
            "or T (powers of 1024, any case, iB or B may follow), e.g. 512MiB; "
            "unset it for the default 8GiB");
  EXPECT_EQ(ErrorOf(kAllocConf, "max_split_size_mb:99999999999999999999"),
            "PHANTOM_ALLOC_CONF='max_split_size_mb:99999999999999999999' is not "
            "a valid option list: max_split_size_mb='99999999999999999999' is "
            "not in range: larger than 1048576; accepted: comma-separated "
            "key:value options, each at most once: max_split_size_mb (a whole "
            "number of MiB from 21 to 1048576), garbage_collection_threshold (a "
            "fraction strictly between 0 and 1), record_memory_history (a whole "
            "number of entries, 1 or more); unset it for the default (no "
            "options)");
}

TEST(SettingsChoice, AWordOfTheListInAnyCaseItsIndexTheNumber) {
  Value value;
  std::string error;
  ASSERT_TRUE(Parse(kCpuFallback, " Silent ", &value, &error)) << error;
  EXPECT_EQ(value.number, 1u);
  EXPECT_EQ(value.text, "silent");
  ASSERT_TRUE(Parse(kCpuFallback, nullptr, &value, &error));
  EXPECT_EQ(value.number, 0u);
  EXPECT_EQ(value.text, "warn");
  EXPECT_EQ(ErrorOf(kCpuFallback, "sometimes"),
            "PHANTOM_CPU_FALLBACK='sometimes' is not one of the accepted "
            "words; accepted: one of warn, silent, error; unset it for the "
            "default warn");
}

TEST(SettingsSentence, QuotesTheValueAsGivenWhitespaceIncluded) {
  EXPECT_EQ(ErrorOf(kDeviceCount, " 65 ").rfind("PHANTOM_DEVICE_COUNT=' 65 ' is not", 0),
            0u);
}

TEST(SettingsParse, ARefusalLeavesTheOutputAlone) {
  Value value;
  value.number = 12345;
  std::string error;
  EXPECT_FALSE(Parse(kDeviceCount, "65", &value, &error));
  EXPECT_EQ(value.number, 12345u);
  EXPECT_FALSE(value.set);
}

TEST(SettingsParse, ReadEnvironmentParsesTheVariable) {
  setenv("PHANTOM_FAULT_KERNEL", " 7 ", 1);
  Value value;
  std::string error;
  EXPECT_TRUE(ReadEnvironment(kFaultKernel, &value, &error)) << error;
  EXPECT_TRUE(value.set);
  EXPECT_EQ(value.number, 7u);
  setenv("PHANTOM_FAULT_KERNEL", "seven", 1);
  EXPECT_FALSE(ReadEnvironment(kFaultKernel, &value, &error));
  EXPECT_EQ(error.rfind("PHANTOM_FAULT_KERNEL='seven' is not a whole number", 0), 0u);
  unsetenv("PHANTOM_FAULT_KERNEL");
  EXPECT_TRUE(ReadEnvironment(kFaultKernel, &value, &error));
  EXPECT_FALSE(value.set);
}

TEST(SettingsFormat, SizesUseTheLargestExactBinaryUnit) {
  EXPECT_EQ(FormatSize(kMiB), "1MiB");
  EXPECT_EQ(FormatSize(8 * kGiB), "8GiB");
  EXPECT_EQ(FormatSize(1536 * kKiB), "1536KiB");
  EXPECT_EQ(FormatSize(1000), "1000B");
  EXPECT_EQ(FormatSize(0), "0B");
  EXPECT_EQ(FormatSize(kTiB * 1024), "1024TiB");
}

}  // namespace
}  // namespace phantom::settings
