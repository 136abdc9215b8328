#pragma once
// What the evaluator calls on values: operators (ops.cpp), filters and tests (filters.cpp),
// methods of str / dict / list and the globals (methods.cpp). They throw EvalError; the
// evaluator adds the template name and line.
#include <string>
#include <string_view>
#include <vector>

#include "chat/ast.h"
#include "chat/eval.h"
#include "chat/value.h"

namespace ptllm::chat::builtins {

// Operators.
Value arith(Op op, const Value& a, const Value& b);
Value negate(const Value& v, bool minus);
bool contains(const Value& container, const Value& needle);  // Python `needle in container`
bool compare(Op op, const Value& a, const Value& b);         // == != < > <= >=
// The sandbox's getattr / getitem: methods of str, list and dict first for attributes, keys
// first for subscripts; a miss is Undefined (printing empty), a miss on Undefined an error.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// What `for x in v` walks: list items, dict keys, str characters; Undefined: nothing.
List iterate(const Value& v);
[[noreturn]] void fail_undefined(const Value& u);
// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

// Filters and tests.
Value filter(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args);
bool test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args);
bool is_filter(std::string_view name);
bool is_test(std::string_view name);

// Methods and globals.
bool has_method(const Value& obj, std::string_view name);
Value method(Evaluator& ev, const Value& obj, const std::string& name, CallArgs& args);
Value global(const std::string& name);  // Undefined when there is none

// Argument helpers for builtins.
const Value& arg(const CallArgs& a, size_t i, std::string_view name, const Value& dflt);
std::string arg_str(const CallArgs& a, size_t i, std::string_view name, const std::string& dflt);
int64_t arg_int(const CallArgs& a, size_t i, std::string_view name, int64_t dflt);
bool arg_bool(const CallArgs& a, size_t i, std::string_view name, bool dflt);

}  // namespace ptllm::chat::builtins
