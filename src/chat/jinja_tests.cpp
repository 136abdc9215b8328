// Jinja2's tests (`x is defined`, ...), from tests.py.
#include <cmath>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/pystr.h"

namespace ptllm::chat::builtins {

namespace {

using TestFn = bool (*)(Evaluator&, const Value&, CallArgs&);

const Value& other(const CallArgs& a) {
  if (a.pos.empty()) throw EvalError("test requires an argument");
  return a.pos[0];
}

bool t_defined(Evaluator&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Evaluator&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Evaluator&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Evaluator&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Evaluator&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Evaluator&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Evaluator&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Evaluator&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Evaluator&, const Value& v, CallArgs&) { return v.is_number(); }  // bool too
bool t_string(Evaluator&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Evaluator&, const Value& v, CallArgs&) { return v.is_dict(); }
// Undefined is iterable (empty) and, having __len__ and __getitem__, a sequence, as in Jinja2.
bool t_iterable(Evaluator&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Evaluator& ev, const Value& v, CallArgs& a) { return t_iterable(ev, v, a); }
bool t_callable(Evaluator&, const Value& v, CallArgs&) { return v.is_callable(); }

int64_t as_integer(const Value& v, const char* test) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_int() && !v.is_bool()) throw EvalError(std::string("test '") + test + "' needs an integer");
  return v.as_int();
}
bool t_odd(Evaluator&, const Value& v, CallArgs&) { return as_integer(v, "odd") % 2 != 0; }
bool t_even(Evaluator&, const Value& v, CallArgs&) { return as_integer(v, "even") % 2 == 0; }
bool t_divisibleby(Evaluator&, const Value& v, CallArgs& a) {
  const int64_t d = as_integer(other(a), "divisibleby");
  if (d == 0) throw EvalError("integer division or modulo by zero");
  return d == -1 || as_integer(v, "divisibleby") % d == 0;
}

bool t_eq(Evaluator&, const Value& v, CallArgs& a) { return compare(Op::Eq, v, other(a)); }
bool t_ne(Evaluator&, const Value& v, CallArgs& a) { return compare(Op::Ne, v, other(a)); }
bool t_lt(Evaluator&, const Value& v, CallArgs& a) { return compare(Op::Lt, v, other(a)); }
bool t_le(Evaluator&, const Value& v, CallArgs& a) { return compare(Op::Le, v, other(a)); }
bool t_gt(Evaluator&, const Value& v, CallArgs& a) { return compare(Op::Gt, v, other(a)); }
bool t_ge(Evaluator&, const Value& v, CallArgs& a) { return compare(Op::Ge, v, other(a)); }
bool t_in(Evaluator&, const Value& v, CallArgs& a) { return contains(other(a), v); }
// Python's `is`: identity. Singletons and small values compare by value; containers never match
// unless they are the same object, which values of this evaluator cannot tell apart.
bool t_sameas(Evaluator&, const Value& v, CallArgs& a) {
  const Value& o = other(a);
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_bool() || v.is_int() || v.is_undefined()) return equals(v, o);
  if (v.is_namespace() || v.is_callable()) return equals(v, o);
  return false;
}
bool t_lower(Evaluator&, const Value& v, CallArgs&) {
  const std::string s = v.str();
  return pystr::lower(s) == s && pystr::upper(s) != s;
}
bool t_upper(Evaluator&, const Value& v, CallArgs&) {
  const std::string s = v.str();
  return pystr::upper(s) == s && pystr::lower(s) != s;
}
bool t_escaped(Evaluator&, const Value& v, CallArgs&) { return v.is_markup(); }

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},
      {"boolean", t_boolean}, {"true", t_true}, {"false", t_false}, {"integer", t_integer},
      {"float", t_float}, {"number", t_number}, {"string", t_string}, {"mapping", t_mapping},
      {"iterable", t_iterable}, {"sequence", t_sequence}, {"callable", t_callable},
      {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby},
      {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
      {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le},
      {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge},
      {"in", t_in}, {"sameas", t_sameas}, {"lower", t_lower}, {"upper", t_upper},
      {"escaped", t_escaped},
  };
  return m;
}

}  // namespace

bool test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args) {
  const auto& m = tests();
  const auto it = m.find(name);
  if (it == m.end()) throw EvalError("No test named '" + name + "'.");
  return it->second(ev, v, args);
}

bool is_test(std::string_view name) { return tests().count(name) > 0; }

}  // namespace ptllm::chat::builtins
