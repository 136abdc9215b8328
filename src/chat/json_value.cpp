#include "chat/json_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "chat/pystr.h"

namespace ptllm::chat {

namespace {

Value from_json_at(const Json& j, int depth) {
  if (depth > 200) throw Error("JSON input nested too deeply (more than 200 levels)");
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      // Python ints have no limit; beyond int64 the nearest double is the best we can keep.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::real(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float: return Value::real(j.get<double>());
    case Json::value_t::string: return Value::string(j.get<std::string>());
    case Json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.items.emplace_back(Value::string(k), from_json_at(v, depth + 1));
      return Value::dict(std::move(d));
    }
    default: return Value::none();  // binary / discarded: not produced by the parser
  }
}

}  // namespace

Value from_json(const Json& j) { return from_json_at(j, 0); }

namespace {

void dump_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  auto hex4 = [&](unsigned v) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", v & 0xFFFFu);
    out += b;
  };
  for (char32_t c : pystr::decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
      if (c >= 0x10000 && !(c >= 0xDC80 && c <= 0xDCFF)) {
        const char32_t v = c - 0x10000;
        hex4(0xD800 + (v >> 10));
        hex4(0xDC00 + (v & 0x3FF));
      } else {
        hex4(static_cast<unsigned>(c));
      }
      continue;
    }
    pystr::append_utf8(out, c);
  }
  out += '"';
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth);

// json.dumps writes a key as a string: an int, float, bool or None key as its JSON text.
std::string key_text(const Value& k) {
  if (k.is_string()) return k.as_string();
  if (k.is_none() || k.is_bool() || k.is_int() || k.is_float()) {
    std::string s;
    dump(s, k, {}, 0);
    return s;
  }
  throw EvalError("keys must be str, int, float, bool or None, not " + k.type_name());
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  if (depth > 200) throw EvalError("tojson: nesting too deep");
  using K = Value::Kind;
  auto newline = [&](int level) {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case K::None: out += "null"; return;
    case K::Bool: out += v.as_bool() ? "true" : "false"; return;
    case K::Int: out += std::to_string(v.as_int()); return;
    case K::Float: {
      const double d = v.as_double();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += format_float(d);
      return;
    }
    case K::String: dump_string(out, v.as_string(), o.ensure_ascii); return;
    case K::List: {
      const List& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += o.item_sep;
        newline(depth + 1);
        dump(out, l[i], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case K::Dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return less(a->first, b->first); });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        newline(depth + 1);
        dump_string(out, key_text(items[i]->first), o.ensure_ascii);
        out += o.key_sep;
        dump(out, items[i]->second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      throw EvalError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string dump_json(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

}  // namespace ptllm::chat
