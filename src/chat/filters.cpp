// Jinja2's filters (filters.py) and tests (tests.py), with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/json_value.h"
#include "chat/pystr.h"

namespace ptllm::chat::builtins {

namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, CallArgs&);
using TestFn = bool (*)(Evaluator&, const Value&, CallArgs&);

const Value kNone = Value::none();
const Value kUndef;

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(pystr::length(v.as_string()));
    case Value::Kind::List: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.as_dict().items.size());
    default: throw EvalError("object of type '" + v.type_name() + "' has no len()");
  }
}

// Jinja2's make_attrgetter: "a.b.0" walks getitem, digits as list indices.
Value attr_path(const Value& item, const std::string& path) {
  Value cur = item;
  size_t b = 0;
  while (true) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    const bool digits = !part.empty() && pystr::all_of(part, isdigit);
    cur = get_item(cur, digits ? Value::integer(std::atoll(part.c_str())) : Value::string(part));
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

// Sort key for sort / unique / min / max / dictsort: lower-cased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(pystr::lower(v.as_string()));
  return v;
}

Value f_trim(Evaluator&, const Value& v, CallArgs& a) {
  const Value& chars = arg(a, 0, "chars", kNone);
  std::optional<std::string> set;
  if (!chars.is_none()) set = chars.str();
  return Value::string(pystr::strip(v.str(), set, true, true));
}
Value f_length(Evaluator&, const Value& v, CallArgs&) { return Value::integer(length_of(v)); }
Value f_lower(Evaluator&, const Value& v, CallArgs&) { return Value::string(pystr::lower(v.str())); }
Value f_upper(Evaluator&, const Value& v, CallArgs&) { return Value::string(pystr::upper(v.str())); }
Value f_title(Evaluator&, const Value& v, CallArgs&) { return Value::string(pystr::jinja_title(v.str())); }
Value f_capitalize(Evaluator&, const Value& v, CallArgs&) { return Value::string(pystr::capitalize(v.str())); }
Value f_string(Evaluator&, const Value& v, CallArgs&) { return v.is_string() ? v : Value::string(v.str()); }
Value f_safe(Evaluator&, const Value& v, CallArgs&) { return Value::markup(v.str()); }

Value f_replace(Evaluator&, const Value& v, CallArgs& a) {
  const Value& cnt = arg(a, 2, "count", kNone);
  return Value::string(pystr::replace(v.str(), arg_str(a, 0, "old", ""), arg_str(a, 1, "new", ""),
                                      cnt.is_none() ? -1 : cnt.as_int()));
}

Value f_join(Evaluator&, const Value& v, CallArgs& a) {
  const std::string sep = arg_str(a, 0, "d", "");
  const Value& attr = arg(a, 1, "attribute", kNone);
  std::string out;
  bool first = true;
  for (const auto& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += attr.is_none() ? x.str() : attr_path(x, attr.str()).str();
  }
  return Value::string(std::move(out));
}

Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  const bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value::string(""));
  return v;
}

Value f_first(Evaluator&, const Value& v, CallArgs&) {
  const List items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}
Value f_last(Evaluator&, const Value& v, CallArgs&) {
  const List items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}
Value f_list(Evaluator&, const Value& v, CallArgs&) { return Value::list(iterate(v)); }

Value f_items(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw EvalError("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::list({k, x}, true));
  return Value::list(std::move(out));
}

// As Jinja2, map and the select family yield nothing for a falsy value (None, 0, ''), before
// looking at their arguments: functionary's template filters `tools` when it is None.
Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  List out;
  if (!v.truthy()) return Value::list({});
  if (const Value* attr = a.get(SIZE_MAX, "attribute")) {
    const Value* dflt = a.get(SIZE_MAX, "default");
    for (const auto& x : iterate(v)) {
      Value r = attr_path(x, attr->str());
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) throw EvalError("map requires a filter argument");
  const std::string name = a.pos[0].str();
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& x : iterate(v)) {
    CallArgs each = rest;
    out.push_back(filter(ev, name, x, each));
  }
  return Value::list(std::move(out));
}

// select / reject / selectattr / rejectattr: `attr` set for the *attr forms.
Value select_impl(Evaluator& ev, const Value& v, CallArgs& a, bool keep, bool by_attr) {
  if (!v.truthy()) return Value::list({});
  size_t first = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) throw EvalError("selectattr requires an attribute");
    attr = a.pos[0].str();
    first = 1;
  }
  std::string test_name;
  CallArgs targs;
  if (a.pos.size() > first) {
    test_name = a.pos[first].str();
    targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(first) + 1, a.pos.end());
  }
  List out;
  for (const auto& x : iterate(v)) {
    const Value probe = by_attr ? attr_path(x, attr) : x;
    CallArgs each = targs;
    const bool pass = test_name.empty() ? probe.truthy() : test(ev, test_name, probe, each);
    if (pass == keep) out.push_back(x);
  }
  return Value::list(std::move(out));
}
Value f_select(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, false); }
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, true); }

// transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
Value f_tojson(Evaluator&, const Value& v, CallArgs& a) {
  JsonDumpOptions o;
  o.ensure_ascii = arg(a, 0, "ensure_ascii", Value::boolean(false)).truthy();
  const Value& indent = arg(a, 1, "indent", kNone);
  if (indent.is_string()) o.indent = indent.as_string();
  else if (indent.is_int() || indent.is_bool()) o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 1000))), ' ');
  else if (!indent.is_none()) throw EvalError("tojson: indent must be an integer or a string");
  if (o.indent) o.item_sep = ",";
  const Value& seps = arg(a, 2, "separators", kNone);
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.as_list().size() != 2 || !seps.as_list()[0].is_string() || !seps.as_list()[1].is_string())
      throw EvalError("tojson: separators must be a pair of strings");
    o.item_sep = seps.as_list()[0].as_string();
    o.key_sep = seps.as_list()[1].as_string();
  }
  o.sort_keys = arg(a, 3, "sort_keys", Value::boolean(false)).truthy();
  return Value::string(dump_json(v, o));
}

std::optional<int64_t> parse_int(std::string s, int base) {
  s = pystr::strip(s, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(s[i] == '_' && i > 0 && i + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[i - 1])) && std::isalnum(static_cast<unsigned char>(s[i + 1])))) clean += s[i];
  if (clean.empty() || base < 2 || base > 36) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(clean.c_str(), &end, base);
  if (errno != 0 || *end != '\0' || !(std::isalnum(static_cast<unsigned char>(clean.back())))) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  const std::string t = pystr::strip(s, std::nullopt, true, true);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (*end != '\0' || t.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  return d;
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  const Value dflt = arg(a, 0, "default", Value::integer(0));
  const int base = static_cast<int>(arg_int(a, 1, "base", 10));
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_double()) || std::fabs(v.as_double()) > 9.2e18) return dflt;
    return Value::integer(static_cast<int64_t>(v.as_double()));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value::integer(*i);
    if (auto d = parse_float(v.as_string()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
      return Value::integer(static_cast<int64_t>(*d));
  }
  return dflt;
}

Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  const Value dflt = arg(a, 0, "default", Value::real(0.0));
  if (v.is_number()) return Value::real(v.as_double());
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return Value::real(*d);
  return dflt;
}

Value f_indent(Evaluator&, const Value& v, CallArgs& a) {
  const Value w = arg(a, 0, "width", Value::integer(4));  // a copy: the default is a temporary
  const std::string ind = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(w.as_int(), 0, 1000)), ' ');
  const bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  const std::vector<std::string> lines = pystr::splitlines(v.str() + "\n");
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) rv += "\n";
    if (i && (blank || !lines[i].empty())) rv += ind;
    rv += lines[i];
  }
  return Value::string(first ? ind + rv : rv);
}

Value f_abs(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::real(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) return v.as_int() < 0 ? negate(v, true) : Value::integer(v.as_int());
  throw EvalError("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  const int64_t prec = std::clamp<int64_t>(arg_int(a, 0, "precision", 0), -300, 300);
  const std::string method = arg_str(a, 1, "method", "common");
  if (!v.is_number()) throw EvalError("type " + v.type_name() + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());  // round(int, n) stays an int (n >= 0)
    if (prec <= 0 || !std::isfinite(v.as_double())) {
      const double scale = std::pow(10.0, static_cast<double>(-prec));
      return Value::real(std::nearbyint(v.as_double() / scale) * scale);  // ties to even, as Python
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), v.as_double());  // correctly rounded
    return Value::real(std::strtod(buf, nullptr));
  }
  if (method != "floor" && method != "ceil") throw EvalError("method must be common, ceil or floor");
  const double scale = std::pow(10.0, static_cast<double>(prec));
  const double x = v.as_double() * scale;
  return Value::real((method == "floor" ? std::floor(x) : std::ceil(x)) / scale);
}

Value f_unique(Evaluator&, const Value& v, CallArgs& a) {
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value& attr = arg(a, 1, "attribute", kNone);
  List out, seen;
  for (const auto& x : iterate(v)) {
    const Value key = sort_key(attr.is_none() ? x : attr_path(x, attr.str()), cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(x);
    }
  }
  return Value::list(std::move(out));
}

Value f_reverse(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string cps = pystr::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(pystr::encode(cps));
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_sort(Evaluator&, const Value& v, CallArgs& a) {
  const bool rev = arg_bool(a, 0, "reverse", false), cs = arg_bool(a, 1, "case_sensitive", false);
  const Value& attr = arg(a, 2, "attribute", kNone);
  List items = iterate(v);
  auto key = [&](const Value& x) { return sort_key(attr.is_none() ? x : attr_path(x, attr.str()), cs); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value f_dictsort(Evaluator&, const Value& v, CallArgs& a) {
  if (!v.is_dict()) throw EvalError("You can only sort by either a dict");
  const bool cs = arg_bool(a, 0, "case_sensitive", false), rev = arg_bool(a, 2, "reverse", false);
  const bool by_value = arg_str(a, 1, "by", "key") == "value";
  List items;
  for (const auto& [k, x] : v.as_dict().items) items.push_back(Value::list({k, x}, true));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.as_list()[by_value], cs), ky = sort_key(y.as_list()[by_value], cs);
    return rev ? less(ky, kx) : less(kx, ky);
  });
  return Value::list(std::move(items));
}

Value f_wordcount(Evaluator&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : pystr::decode(v.str())) {
    const bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !pystr::is_space(c));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_sum(Evaluator&, const Value& v, CallArgs& a) {
  const Value& attr = arg(a, 0, "attribute", kNone);
  Value acc = arg(a, 1, "start", Value::integer(0));
  for (const auto& x : iterate(v)) acc = arith(Op::Add, acc, attr.is_none() ? x : attr_path(x, attr.str()));
  return acc;
}

Value minmax(const Value& v, CallArgs& a, bool want_max) {
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value& attr = arg(a, 1, "attribute", kNone);
  const List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  auto key = [&](size_t i) { return sort_key(attr.is_none() ? items[i] : attr_path(items[i], attr.str()), cs); };
  for (size_t i = 1; i < items.size(); ++i)
    if (want_max ? less(key(best), key(i)) : less(key(i), key(best))) best = i;
  return items[best];
}
Value f_max(Evaluator&, const Value& v, CallArgs& a) { return minmax(v, a, true); }
Value f_min(Evaluator&, const Value& v, CallArgs& a) { return minmax(v, a, false); }

// |attr is getattr only: methods and namespace attributes, never dict keys (Jinja2's do_attr).
Value f_attr(Evaluator&, const Value& v, CallArgs& a) {
  const std::string name = arg_str(a, 0, "name", "");
  if (v.is_namespace() || has_method(v, name)) return get_attr(v, name);
  return Value::undefined("'" + v.type_name() + " object' has no attribute '" + name + "'");
}

Value f_center(Evaluator&, const Value& v, CallArgs& a) {
  const std::string s = v.str();
  const int64_t width = std::min<int64_t>(arg_int(a, 0, "width", 80), 1 << 20);
  const int64_t len = static_cast<int64_t>(pystr::length(s));
  if (width <= len) return Value::string(s);
  const int64_t pad = width - len, left = pad / 2 + (pad & width & 1);  // Python's str.center
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
}

Value f_escape(Evaluator&, const Value& v, CallArgs&) {
  return v.is_markup() ? v : Value::markup(html_escape(v.str()));
}
Value f_forceescape(Evaluator&, const Value& v, CallArgs&) { return Value::markup(html_escape(v.str())); }

// printf-style "%s" % args, the conversions templates use: %s %r %d %i %f %%.
Value f_format(Evaluator&, const Value& v, CallArgs& a) {
  const std::string fmt = v.str();
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw EvalError("incomplete format");
    std::string spec;
    while (i < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[i])) || fmt[i] == '.' || fmt[i] == '-')) spec += fmt[i++];
    if (i >= fmt.size()) throw EvalError("incomplete format");
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= a.pos.size()) throw EvalError("not enough arguments for format string");
    const Value& x = a.pos[next++];
    char buf[128];
    if (c == 's') out += x.str();
    else if (c == 'r') out += x.repr();
    else if ((c == 'd' || c == 'i') && x.is_number() && std::fabs(x.as_double()) < 9.2e18)
      out += std::to_string(x.is_float() ? static_cast<int64_t>(x.as_double()) : x.as_int());
    else if (c == 'f' && x.is_number()) {
      std::snprintf(buf, sizeof buf, ("%" + spec + "f").c_str(), x.as_double());
      out += buf;
    } else throw EvalError(std::string("unsupported format character '") + c + "'");
  }
  if (next < a.pos.size()) throw EvalError("not all arguments converted during string formatting");
  return Value::string(std::move(out));
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> m = {
      {"trim", f_trim}, {"length", f_length}, {"count", f_length}, {"lower", f_lower},
      {"upper", f_upper}, {"title", f_title}, {"capitalize", f_capitalize}, {"string", f_string},
      {"safe", f_safe}, {"replace", f_replace}, {"join", f_join}, {"default", f_default},
      {"d", f_default}, {"first", f_first}, {"last", f_last}, {"list", f_list}, {"items", f_items},
      {"map", f_map}, {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr}, {"tojson", f_tojson}, {"int", f_int}, {"float", f_float},
      {"indent", f_indent}, {"abs", f_abs}, {"round", f_round}, {"unique", f_unique},
      {"reverse", f_reverse}, {"sort", f_sort}, {"dictsort", f_dictsort}, {"wordcount", f_wordcount},
      {"sum", f_sum}, {"max", f_max}, {"min", f_min}, {"attr", f_attr}, {"center", f_center},
      {"escape", f_escape}, {"e", f_escape}, {"forceescape", f_forceescape}, {"format", f_format},
  };
  return m;
}

}  // namespace

Value filter(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args) {
  const auto& m = filters();
  const auto it = m.find(name);
  if (it == m.end()) throw EvalError("No filter named '" + name + "'.");
  return it->second(ev, v, args);
}

bool is_filter(std::string_view name) { return filters().count(name) > 0; }

}  // namespace ptllm::chat::builtins
