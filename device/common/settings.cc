// The settings parser; phantom/common/settings.h has the rules and why.
//
// Each kind's parser returns the problem as a phrase that completes
// "NAME='value' is not ..." ("a whole number", "in range: larger than 64");
// Parse() wraps it into the full sentence, so every setting and every
// option of a list gets the same shape.
#include <phantom/common/settings.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace phantom::settings {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

char Lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

std::string_view Trim(std::string_view text) {
  while (!text.empty() && IsSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
  return text;
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

// The leading run of digits of `text`.
std::string_view LeadingDigits(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsDigit(text[n])) ++n;
  return text.substr(0, n);
}

// `digits` (non-empty, all digits) as a number; false if it does not fit
// in 64 bits.
bool ToNumber(std::string_view digits, uint64_t* out) {
  uint64_t value = 0;
  for (char c : digits) {
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *out = value;
  return true;
}

std::string Quoted(std::string_view text) {
  return "'" + std::string(text) + "'";
}

// The range of a count or size, as the messages say it.
std::string Limit(const Spec& spec, uint64_t value) {
  return spec.kind == Kind::kSize ? FormatSize(value) : std::to_string(value);
}

// "in range: larger than 64", or "" when `value` is within the range.
// `fits` is false for a number too large for 64 bits.
std::string RangeProblem(const Spec& spec, bool fits, uint64_t value) {
  if (!fits || value > spec.max) {
    return "in range: larger than " + Limit(spec, spec.max);
  }
  if (value < spec.min) {
    return "in range: smaller than " + Limit(spec, spec.min);
  }
  return "";
}

// Each parser: `text` is trimmed and non-empty; returns "" and fills *out,
// or returns the problem phrase.

std::string ParseCount(const Spec& spec, std::string_view text, Value* out) {
  const std::string_view digits = LeadingDigits(text);
  if (digits.empty() || digits.size() != text.size()) {
    return "a whole number";
  }
  uint64_t value = 0;
  const bool fits = ToNumber(digits, &value);
  std::string problem = RangeProblem(spec, fits, value);
  if (problem.empty()) out->number = value;
  return problem;
}

std::string ParseSize(const Spec& spec, std::string_view text, Value* out) {
  const std::string_view digits = LeadingDigits(text);
  if (digits.empty()) return "a size";
  const std::string_view unit = Trim(text.substr(digits.size()));
  int shift = 0;
  if (!unit.empty()) {
    const char* const prefixes = "kmgt";
    const char* prefix = std::strchr(prefixes, Lower(unit.front()));
    const std::string_view rest = unit.substr(1);
    if (EqualsIgnoringCase(unit, "b")) {
      shift = 0;
    } else if (prefix != nullptr && *prefix != '\0' &&
               (rest.empty() || EqualsIgnoringCase(rest, "b") ||
                EqualsIgnoringCase(rest, "ib"))) {
      shift = 10 * static_cast<int>(prefix - prefixes + 1);
    } else {
      return "a size: " + Quoted(unit) + " is not a unit";
    }
  }
  uint64_t number = 0;
  bool fits = ToNumber(digits, &number);
  if (fits && number > (UINT64_MAX >> shift)) fits = false;
  const uint64_t bytes = fits ? number << shift : 0;
  std::string problem = RangeProblem(spec, fits, bytes);
  if (problem.empty()) out->number = bytes;
  return problem;
}

// A number like any other, so "01" is 1 as "064" is 64 for a count.
std::string ParseSwitch(std::string_view text, Value* out) {
  const std::string_view digits = LeadingDigits(text);
  uint64_t value = 0;
  if (digits.empty() || digits.size() != text.size() ||
      !ToNumber(digits, &value) || value > 1) {
    return "0 or 1";
  }
  out->number = value;
  return "";
}

std::string ParseFraction(std::string_view text, Value* out) {
  const std::string_view whole = LeadingDigits(text);
  std::string_view rest = text.substr(whole.size());
  std::string_view decimals;
  if (!rest.empty() && rest.front() == '.') {
    decimals = LeadingDigits(rest.substr(1));
    rest = rest.substr(1 + decimals.size());
  }
  if (!rest.empty() || (whole.empty() && decimals.empty())) {
    return "a fraction";
  }
  // Any whole part other than zeros makes it at least 1.
  if (whole.find_first_not_of('0') != std::string_view::npos) {
    return "in range: not below 1";
  }
  // Locale-independent (strtod's decimal point depends on the locale).
  double value = 0;
  double scale = 0.1;
  for (char c : decimals) {
    value += (c - '0') * scale;
    scale /= 10;
  }
  if (value <= 0) return "in range: not above 0";
  out->fraction = value;
  return "";
}

std::string ParseOptions(const Spec& spec, std::string_view text,
                         Value* out) {
  Value result;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = Trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) continue;  // ",," or a trailing comma
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return "a list of key:value options: " + Quoted(item) + " has no ':'";
    }
    const std::string_view key = Trim(item.substr(0, colon));
    const std::string_view text_value = Trim(item.substr(colon + 1));
    const Spec* option = nullptr;
    for (size_t i = 0; i < spec.option_count; ++i) {
      if (EqualsIgnoringCase(key, spec.options[i]->name)) {
        option = spec.options[i];
      }
    }
    if (option == nullptr) {
      return "a list of known options: " + Quoted(key) +
             " is not an option";
    }
    if (result.option(*option) != nullptr) {
      return "a valid option list: " + std::string(option->name) +
             " is given twice";
    }
    Value parsed;
    std::string problem;
    if (option->kind == Kind::kCount) {
      problem = ParseCount(*option, text_value, &parsed);
    } else {
      problem = ParseFraction(text_value, &parsed);
    }
    if (!problem.empty()) {
      return "a valid option list: " + std::string(option->name) + "=" +
             Quoted(text_value) + " is not " + problem;
    }
    result.options.push_back({option, parsed.number, parsed.fraction});
  }
  out->options = std::move(result.options);
  return "";
}

// A library: a file name (searched as the dynamic loader searches) or a
// path; whatever the loader then says about it is the loader's refusal.
// Refused here: what cannot name a file at all.
std::string ParseLibrary(std::string_view text, Value* out) {
  if (text.back() == '/') {
    return "a library: it ends with '/', which names a folder";
  }
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return "a library: it holds a control character";
    }
  }
  out->text = std::string(text);
  return "";
}

// One of the spec's words, any case; the number is its index.
std::string ParseChoice(const Spec& spec, std::string_view text, Value* out) {
  for (size_t i = 0; i < spec.choice_count; ++i) {
    if (EqualsIgnoringCase(text, spec.choices[i])) {
      out->number = i;
      out->text = spec.choices[i];
      return "";
    }
  }
  return "one of the accepted words";
}

std::string Describe(const Spec& spec, bool in_list);

// "a whole number of MiB from 21 to 1048576".
std::string DescribeCount(const Spec& spec) {
  std::string text = "a whole number";
  if (spec.unit != nullptr) text += std::string(" of ") + spec.unit;
  if (spec.max == kUnbounded) {
    return text + ", " + std::to_string(spec.min) + " or more";
  }
  return text + " from " + std::to_string(spec.min) + " to " +
         std::to_string(spec.max);
}

std::string Describe(const Spec& spec, bool in_list) {
  switch (spec.kind) {
    case Kind::kCount:
      return DescribeCount(spec);
    case Kind::kSize:
      return "a size from " + FormatSize(spec.min) + " to " +
             FormatSize(spec.max) +
             ", in bytes or with a unit K, M, G or T (powers of 1024, any "
             "case, iB or B may follow), e.g. 512MiB";
    case Kind::kSwitch:
      return "1 (on) or 0 (off)";
    case Kind::kFraction:
      return in_list ? "a fraction strictly between 0 and 1"
                     : "a fraction strictly between 0 and 1, e.g. 0.8";
    case Kind::kLibrary:
      return "a shared library's file name (looked for next to the runtime, "
             "then as the dynamic loader looks) or its path";
    case Kind::kChoice: {
      std::string text = "one of";
      for (size_t i = 0; i < spec.choice_count; ++i) {
        text += std::string(i == 0 ? " " : ", ") + spec.choices[i];
      }
      return text;
    }
    case Kind::kOptions: {
      std::string text = "comma-separated key:value options, each at most once:";
      for (size_t i = 0; i < spec.option_count; ++i) {
        const Spec& option = *spec.options[i];
        text += std::string(i == 0 ? " " : ", ") + option.name + " (" +
                Describe(option, true) + ")";
      }
      return text;
    }
  }
  return "";
}

}  // namespace

const Value::Option* Value::option(const Spec& spec) const {
  for (const Option& given : options) {
    if (given.spec == &spec) return &given;
  }
  return nullptr;
}

const Spec* Find(const char* name) {
  for (const Spec* spec : kAll) {
    if (std::strcmp(spec->name, name) == 0) return spec;
  }
  return nullptr;
}

bool Parse(const Spec& spec, const char* text, Value* out,
           std::string* error) {
  const std::string_view trimmed = Trim(text == nullptr ? "" : text);
  Value value;
  value.number = spec.default_number;
  if (spec.kind == Kind::kLibrary || spec.kind == Kind::kChoice) {
    value.text = spec.default_text;
  }
  if (trimmed.empty()) {
    *out = std::move(value);
    return true;
  }
  std::string problem;
  switch (spec.kind) {
    case Kind::kCount: problem = ParseCount(spec, trimmed, &value); break;
    case Kind::kSize: problem = ParseSize(spec, trimmed, &value); break;
    case Kind::kSwitch: problem = ParseSwitch(trimmed, &value); break;
    case Kind::kFraction: problem = ParseFraction(trimmed, &value); break;
    case Kind::kOptions: problem = ParseOptions(spec, trimmed, &value); break;
    case Kind::kLibrary: problem = ParseLibrary(trimmed, &value); break;
    case Kind::kChoice: problem = ParseChoice(spec, trimmed, &value); break;
  }
  if (!problem.empty()) {
    *error = std::string(spec.name) + "=" + Quoted(text) + " is not " +
             problem + "; accepted: " + Accepted(spec) +
             "; unset it for the default " + spec.default_text;
    return false;
  }
  value.set = true;
  *out = std::move(value);
  return true;
}

bool ReadEnvironment(const Spec& spec, Value* out, std::string* error) {
  return Parse(spec, std::getenv(spec.name), out, error);
}

std::string Accepted(const Spec& spec) { return Describe(spec, false); }

const char* ReaderName(Reader reader) {
  switch (reader) {
    case Reader::kDriver: return "fake driver";
    case Reader::kRuntime: return "runtime";
    case Reader::kOps: return "ops";
    case Reader::kPython: return "python";
  }
  return "?";
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCount: return "count";
    case Kind::kSize: return "size";
    case Kind::kSwitch: return "switch";
    case Kind::kFraction: return "fraction";
    case Kind::kOptions: return "options";
    case Kind::kLibrary: return "library";
    case Kind::kChoice: return "choice";
  }
  return "?";
}

std::string FormatSize(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (unit + 1 < sizeof(kUnits) / sizeof(kUnits[0]) && bytes != 0 &&
         bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

}  // namespace phantom::settings
