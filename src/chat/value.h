#pragma once
// The evaluator's value type: the Python objects a chat template sees (None, bool, int, float,
// str, list/tuple, dict, Jinja2's Undefined and namespace, callables), with Python's semantics for
// truthiness, equality, ordering and printing (str() and repr()), since templates rely on them.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ptllm::chat {

// A template error: syntax, a failed call, raise_exception. `what()` names the template and line.
struct TemplateError : Error {
  TemplateError(const std::string& template_name, int line, const std::string& message);
  int line = 0;
  std::string message;  // without the template and line
};

// Thrown by builtins that do not know the line; the evaluator adds template and line.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Value;
using List = std::vector<Value>;
// Insertion-ordered (Python 3.7+ dict order); chat dicts are small, so lookup is linear. Keys are
// strings mostly, but any hashable value (int, float, bool, None, a tuple of those) may be one:
// Seed-OSS keys a table by ints. As in Python, 1, 1.0 and True are the same key.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(std::string_view key) const;  // a str key
  const Value* find(const Value& key) const;
  void set(std::string_view key, Value v);
  void set(Value key, Value v);  // an existing equal key stays, its value is replaced
};

// Python's hash(): lists, dicts, namespaces and callables cannot be keys; throws EvalError
// "unhashable type: 'list'".
void check_hashable(const Value& key);

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Keyword argument `name`, or positional argument `i`, or nullptr.
  const Value* get(size_t i, std::string_view name) const;
};

class Evaluator;
struct Callable {
  std::string name;
  std::function<Value(Evaluator&, CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

  Value() = default;  // Undefined
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value real(double d);
  static Value string(std::string s);
  // markupsafe's Markup, what `safe` and `escape` return: a str whose `+` HTML-escapes the plain
  // str on the other side (Functionary's template relies on it).
  static Value markup(std::string s);
  static Value list(List items, bool tuple = false);
  static Value dict(Dict d);
  static Value ns(Dict d);  // namespace(): the one mutable object templates have
  static Value callable(std::string name, std::function<Value(Evaluator&, CallArgs&)> fn,
                        int captured_depth = 0);

  // How deeply lists, dicts and callables nest inside this value (0 for a scalar). Construction
  // fails past kMaxDepth, and a namespace may not hold a namespace: so printing, comparing and
  // destroying any value stays a bounded recursion, whatever the template does.
  static constexpr int kMaxDepth = 256;
  int depth() const { return depth_; }
  bool holds_namespace() const;

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_markup() const { return kind_ == Kind::String && markup_; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Bool ? int64_t{b_} : i_; }  // bool is an int
  double as_double() const;  // Int, Bool or Float
  const std::string& as_string() const { return s_; }  // String; Undefined: its name
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }  // Dict or Namespace
  Dict& namespace_dict() const { return *dict_; }
  const Callable& as_callable() const { return *fn_; }

  bool truthy() const;            // Python bool(x); Undefined is false
  std::string str() const;        // Python str(x); Undefined is ""
  std::string repr() const;       // Python repr(x), as lists and dicts print their items
  std::string type_name() const;  // Python's type name, for messages

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  bool tuple_ = false;
  bool markup_ = false;
  uint16_t depth_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> fn_;
};

// Python ==, for all kinds (1 == 1.0 == True; lists and dicts deep; Undefined == Undefined).
bool equals(const Value& a, const Value& b);
// Python <: numbers, strings (code point order = UTF-8 byte order), lists; otherwise EvalError.
bool less(const Value& a, const Value& b);
// Python float repr: shortest round-trip digits, "1.0", "1e+16", "1e-05", "inf", "nan".
std::string format_float(double d);
// Python repr of a str: single quotes unless the text has ' and no ".
std::string repr_string(std::string_view s);

}  // namespace ptllm::chat
