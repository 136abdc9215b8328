// Operators with Python's semantics, and the sandbox's attribute and item access.
#include <cmath>

#include "chat/builtins.h"
#include "chat/pystr.h"

namespace ptllm::chat::builtins {

namespace {

constexpr size_t kMaxRepeat = size_t{64} << 20;  // 'x' * n and [x] * n: bytes / items

std::string op_symbol(Op op) {
  switch (op) {
    case Op::Add: return "+";
    case Op::Sub: return "-";
    case Op::Mul: return "*";
    case Op::Div: return "/";
    case Op::FloorDiv: return "//";
    case Op::Mod: return "%";
    case Op::Pow: return "**";
    default: return "?";
  }
}

[[noreturn]] void unsupported(Op op, const Value& a, const Value& b) {
  if (op == Op::Add && a.is_string())
    throw EvalError("can only concatenate str (not \"" + b.type_name() + "\") to str");
  throw EvalError("unsupported operand type(s) for " + op_symbol(op) + ": '" + a.type_name() +
                  "' and '" + b.type_name() + "'");
}

// Python ints do not overflow; ours are 64-bit and fail instead of wrapping.
template <typename F>
int64_t checked(F op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op(x, y, &r)) throw EvalError("integer overflow");
  return r;
}
bool add_ovf(int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); }
bool sub_ovf(int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); }
bool mul_ovf(int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); }

Value int_arith(Op op, int64_t x, int64_t y) {
  switch (op) {
    case Op::Add: return Value::integer(checked(add_ovf, x, y));
    case Op::Sub: return Value::integer(checked(sub_ovf, x, y));
    case Op::Mul: return Value::integer(checked(mul_ovf, x, y));
    case Op::Div:
      if (y == 0) throw EvalError("division by zero");
      return Value::real(static_cast<double>(x) / static_cast<double>(y));
    case Op::FloorDiv:
    case Op::Mod: {
      if (y == 0) throw EvalError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) throw EvalError("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors toward -inf
      return Value::integer(op == Op::FloorDiv ? q : m);
    }
    case Op::Pow: {
      if (y < 0) return Value::real(std::pow(static_cast<double>(x), static_cast<double>(y)));
      int64_t acc = 1, base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if (e & 1) acc = checked(mul_ovf, acc, base);
        if (e > 1) base = checked(mul_ovf, base, base);
      }
      return Value::integer(acc);
    }
    default: return Value();
  }
}

Value float_arith(Op op, double x, double y) {
  switch (op) {
    case Op::Add: return Value::real(x + y);
    case Op::Sub: return Value::real(x - y);
    case Op::Mul: return Value::real(x * y);
    case Op::Div:
      if (y == 0) throw EvalError("float division by zero");
      return Value::real(x / y);
    case Op::FloorDiv:
    case Op::Mod: {
      if (y == 0) throw EvalError("float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::real(op == Op::Mod ? m : std::floor(x / y));
    }
    case Op::Pow: return Value::real(std::pow(x, y));
    default: return Value();
  }
}

Value repeat(const Value& seq, int64_t n) {
  const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
  if (n <= 0 || unit == 0) return seq.is_string() ? Value::string("") : Value::list({}, seq.is_tuple());
  if (unit != 0 && static_cast<uint64_t>(n) > kMaxRepeat / unit) throw EvalError("repeated sequence too large");
  if (seq.is_string()) {
    std::string out;
    out.reserve(unit * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::string(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value::list(std::move(out), seq.is_tuple());
}

}  // namespace

void fail_undefined(const Value& u) {
  throw EvalError(u.as_string().empty() ? "value is undefined" : u.as_string());
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value arith(Op op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return float_arith(op, a.as_double(), b.as_double());
    return int_arith(op, a.as_int(), b.as_int());
  }
  if (op == Op::Add) {
    if (a.is_string() && b.is_string()) {
      if (!a.is_markup() && !b.is_markup()) return Value::string(a.as_string() + b.as_string());
      auto text = [](const Value& v) { return v.is_markup() ? v.as_string() : html_escape(v.as_string()); };
      return Value::markup(text(a) + text(b));
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(out), a.is_tuple());
    }
  }
  if (op == Op::Mul) {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  }
  unsupported(op, a, b);
}

Value negate(const Value& v, bool minus) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_float()) return Value::real(minus ? -v.as_double() : v.as_double());
  if (v.is_int() || v.is_bool()) {
    if (!minus) return Value::integer(v.as_int());
    if (v.as_int() == INT64_MIN) throw EvalError("integer overflow");
    return Value::integer(-v.as_int());
  }
  throw EvalError(std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": '" + v.type_name() + "'");
}

bool contains(const Value& c, const Value& needle) {
  switch (c.kind()) {
    case Value::Kind::Undefined: return false;  // Undefined iterates as empty
    case Value::Kind::String:
      if (!needle.is_string())
        throw EvalError("'in <string>' requires string as left operand, not " + needle.type_name());
      return c.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const auto& x : c.as_list())
        if (equals(x, needle)) return true;
      return false;
    case Value::Kind::Dict:
      check_hashable(needle);
      return c.as_dict().find(needle) != nullptr;
    default: throw EvalError("argument of type '" + c.type_name() + "' is not iterable");
  }
}

bool compare(Op op, const Value& a, const Value& b) {
  switch (op) {
    case Op::Eq: return equals(a, b);
    case Op::Ne: return !equals(a, b);
    default: break;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  switch (op) {
    case Op::Lt: return less(a, b);
    case Op::Gt: return less(b, a);
    case Op::Le: return !less(b, a);
    case Op::Ge: return !less(a, b);
    default: return false;
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_namespace()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  } else if (has_method(obj, name)) {
    const Value self = obj;
    const std::string n = name;
    return Value::callable(name, [self, n](Evaluator& ev, CallArgs& a) { return method(ev, self, n, a); },
                           self.depth());
  } else if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  }
  std::string tname = obj.type_name();
  if (obj.is_none() || obj.is_bool() || obj.is_int() || obj.is_float())
    return Value::undefined("'" + obj.str() + "' has no attribute '" + name + "'");
  return Value::undefined("'" + tname + " object' has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if ((obj.is_dict() || obj.is_namespace()) && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
    if (obj.is_dict() && has_method(obj, key.as_string())) return get_attr(obj, key.as_string());
    return Value::undefined("'dict object' has no attribute '" + key.as_string() + "'");
  }
  if (obj.is_dict()) {
    if (!key.is_list() && !key.is_dict() && !key.is_namespace() && !key.is_callable())
      if (const Value* v = obj.as_dict().find(key)) return *v;
    return Value::undefined("'dict object' has no element " + key.repr());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      const int64_t n = static_cast<int64_t>(pystr::length(obj.as_string()));
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(pystr::char_at(obj.as_string(), i));
    }
    return Value::undefined(obj.type_name() + " index out of range");
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + key.str() + "'");
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.as_list();
    case Value::Kind::Dict: {
      List keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& [k, x] : v.as_dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      std::string one;
      for (char32_t c : pystr::decode(v.as_string())) {
        one.clear();
        pystr::append_utf8(one, c);
        chars.push_back(Value::string(one));
      }
      return chars;
    }
    default: throw EvalError("'" + v.type_name() + "' object is not iterable");
  }
}

}  // namespace ptllm::chat::builtins
