// Methods of str, dict and list that templates call, and the globals: range, namespace, dict,
// and transformers' raise_exception and strftime_now.
#include <algorithm>
#include <array>
#include <cctype>
#include <ctime>

#include "chat/builtins.h"
#include "chat/pystr.h"

namespace ptllm::chat::builtins {

namespace {

constexpr int64_t kMaxRange = 100000;  // Jinja2's sandbox MAX_RANGE

constexpr std::array kStrMethods = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
    "replace", "upper", "lower", "title", "capitalize", "format", "find", "rfind", "count",
    "join", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "removeprefix",
    "removesuffix"};
constexpr std::array kDictMethods = {"get", "items", "keys", "values"};
constexpr std::array kListMethods = {"index", "count"};
// Methods that would modify a value: the immutable sandbox refuses them.
constexpr std::array kUnsafe = {"append", "extend", "insert", "pop", "remove", "reverse", "sort",
                                "clear", "popitem", "setdefault", "update"};

template <size_t N>
bool in(const std::array<const char*, N>& names, std::string_view n) {
  return std::any_of(names.begin(), names.end(), [&](const char* s) { return n == s; });
}

std::optional<std::string> opt_str(const CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw EvalError("expected a string argument, got " + v->type_name());
  return v->as_string();
}

Value str_list(const std::vector<std::string>& parts) {
  List out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::list(std::move(out));
}

bool affix(const std::string& s, const Value& arg, bool prefix) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) throw EvalError("startswith/endswith needs a string or a tuple of strings");
    const std::string& x = p.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (arg.is_list()) return std::any_of(arg.as_list().begin(), arg.as_list().end(), one);
  return one(arg);
}

// str.format: {} {0} {name}, {{ and }}; format specs are not supported.
std::string str_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') throw EvalError("Single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t e = fmt.find('}', i);
    if (e == std::string::npos) throw EvalError("Single '{' encountered in format string");
    const std::string field = fmt.substr(i + 1, e - i - 1);
    i = e;
    if (field.find_first_of(":!") != std::string::npos) throw EvalError("format specs are not supported");
    const Value* v = nullptr;
    if (field.empty()) v = auto_idx < a.pos.size() ? &a.pos[auto_idx++] : nullptr;
    else if (pystr::all_of(field, isdigit)) {
      const size_t k = std::stoul(field);
      v = k < a.pos.size() ? &a.pos[k] : nullptr;
    } else {
      v = a.get(SIZE_MAX, field);
    }
    if (!v) throw EvalError("format: no argument for '{" + field + "}'");
    out += v->str();
  }
  return out;
}

Value string_method(const std::string& s, const std::string& m, CallArgs& a) {
  if (m == "strip" || m == "lstrip" || m == "rstrip")
    return Value::string(pystr::strip(s, opt_str(a, 0, "chars"), m != "rstrip", m != "lstrip"));
  if (m == "split" || m == "rsplit") {
    const auto sep = opt_str(a, 0, "sep");
    const int64_t maxsplit = arg_int(a, 1, "maxsplit", -1);
    return str_list(m == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit));
  }
  if (m == "splitlines") return str_list(pystr::splitlines(s));
  if (m == "startswith" || m == "endswith") {
    if (a.pos.empty()) throw EvalError(m + "() takes at least 1 argument");
    return Value::boolean(affix(s, a.pos[0], m == "startswith"));
  }
  if (m == "replace") {
    if (a.pos.size() < 2) throw EvalError("replace() takes at least 2 arguments");
    return Value::string(pystr::replace(s, a.pos[0].str(), a.pos[1].str(), arg_int(a, 2, "count", -1)));
  }
  if (m == "upper") return Value::string(pystr::upper(s));
  if (m == "lower") return Value::string(pystr::lower(s));
  if (m == "title") return Value::string(pystr::title(s));
  if (m == "capitalize") return Value::string(pystr::capitalize(s));
  if (m == "format") return Value::string(str_format(s, a));
  if (m == "find" || m == "rfind") return Value::integer(pystr::find(s, arg_str(a, 0, "sub", ""), m == "rfind"));
  if (m == "count") return Value::integer(pystr::count(s, arg_str(a, 0, "sub", "")));
  if (m == "join") {
    std::string out;
    bool first = true;
    for (const auto& x : iterate(arg(a, 0, "iterable", Value::list({})))) {
      if (!x.is_string()) throw EvalError("sequence item: expected str instance, " + x.type_name() + " found");
      if (!first) out += s;
      first = false;
      out += x.as_string();
    }
    return Value::string(std::move(out));
  }
  if (m == "isdigit") return Value::boolean(pystr::all_of(s, isdigit));
  if (m == "isalpha") return Value::boolean(pystr::all_of(s, isalpha));
  if (m == "isalnum") return Value::boolean(pystr::all_of(s, isalnum));
  if (m == "isspace") return Value::boolean(pystr::all_of(s, isspace));
  if (m == "isupper") return Value::boolean(pystr::upper(s) == s && pystr::lower(s) != s);
  if (m == "islower") return Value::boolean(pystr::lower(s) == s && pystr::upper(s) != s);
  const std::string x = arg_str(a, 0, "affix", "");
  if (m == "removeprefix") return Value::string(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
  const bool ends = x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  return Value::string(ends ? s.substr(0, s.size() - x.size()) : s);  // removesuffix
}

Value dict_method(const Dict& d, const std::string& m, CallArgs& a) {
  if (m == "get") {
    if (a.pos.empty()) throw EvalError("get expected at least 1 argument, got 0");
    check_hashable(a.pos[0]);
    const Value* v = d.find(a.pos[0]);
    return v ? *v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
  }
  List out;
  for (const auto& [k, v] : d.items) {
    if (m == "items") out.push_back(Value::list({k, v}, true));
    else if (m == "keys") out.push_back(k);
    else out.push_back(v);
  }
  return Value::list(std::move(out));
}

Value list_method(const List& l, const std::string& m, CallArgs& a) {
  if (a.pos.empty()) throw EvalError(m + "() takes exactly one argument");
  int64_t n = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (!equals(l[i], a.pos[0])) continue;
    if (m == "index") return Value::integer(static_cast<int64_t>(i));
    ++n;
  }
  if (m == "index") throw EvalError(a.pos[0].repr() + " is not in list");
  return Value::integer(n);
}

Value g_range(Evaluator&, CallArgs& a) {
  for (const auto& v : a.pos)
    if (!v.is_int() && !v.is_bool()) throw EvalError("'" + v.type_name() + "' object cannot be interpreted as an integer");
  if (a.pos.empty() || a.pos.size() > 3) throw EvalError("range expected 1 to 3 arguments");
  const int64_t start = a.pos.size() == 1 ? 0 : a.pos[0].as_int();
  const int64_t stop = a.pos.size() == 1 ? a.pos[0].as_int() : a.pos[1].as_int();
  const int64_t step = a.pos.size() == 3 ? a.pos[2].as_int() : 1;
  if (step == 0) throw EvalError("range() arg 3 must not be zero");
  const pystr::SliceIdx idx{start, stop, step};
  if (std::max(std::abs(static_cast<double>(stop) - static_cast<double>(start)) / std::abs(static_cast<double>(step)), 0.0) > kMaxRange)
    throw EvalError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  List out;
  for (size_t i = 0, n = idx.count(); i < n; ++i) out.push_back(Value::integer(idx.at(i)));
  return Value::list(std::move(out));
}

Value g_dict(Evaluator&, CallArgs& a, bool is_namespace) {
  Dict d;
  for (const auto& p : a.pos) {
    if (!p.is_dict()) throw EvalError("expected a mapping as positional argument");
    for (const auto& [k, v] : p.as_dict().items) d.set(k, v);
  }
  for (const auto& [k, v] : a.kw) d.set(k, v);
  return is_namespace ? Value::ns(std::move(d)) : Value::dict(std::move(d));
}

Value g_strftime_now(Evaluator& ev, CallArgs& a) {
  const std::string fmt = arg_str(a, 0, "format", "");
  std::tm tm{};
  const std::time_t t = ev.options().now.value_or(std::time(nullptr));
  if (ev.options().now) gmtime_r(&t, &tm);
  else localtime_r(&t, &tm);
  if (fmt.empty()) return Value::string("");
  std::string buf(fmt.size() * 4 + 64, '\0');
  for (int tries = 0; tries < 4; ++tries, buf.resize(buf.size() * 8)) {
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n > 0) return Value::string(buf.substr(0, n));
  }
  return Value::string("");  // a format that formats to nothing
}

}  // namespace

const Value& arg(const CallArgs& a, size_t i, std::string_view name, const Value& dflt) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

std::string arg_str(const CallArgs& a, size_t i, std::string_view name, const std::string& dflt) {
  const Value* v = a.get(i, name);
  return v ? v->str() : dflt;
}

int64_t arg_int(const CallArgs& a, size_t i, std::string_view name, int64_t dflt) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none()) return dflt;
  if (!v->is_int() && !v->is_bool()) throw EvalError("'" + std::string(name) + "' must be an integer");
  return v->as_int();
}

bool arg_bool(const CallArgs& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : dflt;
}

bool has_method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return in(kStrMethods, name);
  if (obj.is_dict()) return in(kDictMethods, name) || in(kUnsafe, name);
  if (obj.is_list()) return in(kListMethods, name) || in(kUnsafe, name);
  return false;
}

Value method(Evaluator&, const Value& obj, const std::string& name, CallArgs& args) {
  if (in(kUnsafe, name))
    throw EvalError("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  if (obj.is_string()) return string_method(obj.as_string(), name, args);
  if (obj.is_dict()) return dict_method(obj.as_dict(), name, args);
  return list_method(obj.as_list(), name, args);
}

Value global(const std::string& name) {
  if (name == "range") return Value::callable("range", g_range);
  if (name == "namespace")
    return Value::callable("namespace", [](Evaluator& ev, CallArgs& a) { return g_dict(ev, a, true); });
  if (name == "dict")
    return Value::callable("dict", [](Evaluator& ev, CallArgs& a) { return g_dict(ev, a, false); });
  if (name == "raise_exception")
    return Value::callable("raise_exception", [](Evaluator&, CallArgs& a) -> Value {
      throw EvalError(a.pos.empty() ? std::string("raise_exception") : a.pos[0].str());
    });
  if (name == "strftime_now") return Value::callable("strftime_now", g_strftime_now);
  return Value();
}

}  // namespace ptllm::chat::builtins
