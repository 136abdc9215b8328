// Expressions.
#include <optional>

#include "chat/builtins.h"
#include "chat/eval.h"
#include "chat/pystr.h"

namespace ptllm::chat {

Value Evaluator::eval(const Expr& e) {
  step();
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::Literal: return e.value;
    case ExprKind::Name: {
      if (const Value* v = lookup(e.name)) return *v;
      Value g = builtins::global(e.name);
      if (!g.is_undefined()) return g;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      List items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a));
      return Value::list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        check_hashable(k);
        d.set(std::move(k), eval(*e.args[i + 1]));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::Attr: return builtins::get_attr(eval(*e.args[0]), e.name);
    case ExprKind::Item: {
      const Value obj = eval(*e.args[0]);
      return builtins::get_item(obj, eval(*e.args[1]));
    }
    case ExprKind::Slice: return eval_slice(e);
    case ExprKind::Call: return eval_call(e);
    case ExprKind::Filter: {
      const Value v = eval(*e.args[0]);
      CallArgs a;
      eval_args(e, 1, a);
      line_ = e.line;
      return builtins::filter(*this, e.name, v, a);
    }
    case ExprKind::Test: {
      const Value v = eval(*e.args[0]);
      CallArgs a;
      eval_args(e, 1, a);
      line_ = e.line;
      return Value::boolean(builtins::test(*this, e.name, v, a) != e.negated);
    }
    case ExprKind::Unary: {
      const Value v = eval(*e.args[0]);
      if (e.op == Op::Not) return Value::boolean(!v.truthy());
      return builtins::negate(v, e.op == Op::Neg);
    }
    case ExprKind::Binary: {
      Value a = eval(*e.args[0]);
      if (e.op == Op::And) return a.truthy() ? eval(*e.args[1]) : a;  // Python: the operand
      if (e.op == Op::Or) return a.truthy() ? a : eval(*e.args[1]);
      const Value b = eval(*e.args[1]);
      line_ = e.line;
      Value r = builtins::arith(e.op, a, b);
      if (r.is_string()) check_size(r.as_string().size());
      return r;
    }
    case ExprKind::Compare: return eval_compare(e);
    case ExprKind::Concat: {
      std::string s;
      for (const auto& a : e.args) {
        s += eval(*a).str();
        check_size(s.size());
      }
      return Value::string(std::move(s));
    }
    case ExprKind::Cond:
      if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
  }
  return Value();
}

Value Evaluator::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    line_ = e.line;
    const Op op = e.ops[i];
    bool ok;
    if (op == Op::In || op == Op::NotIn) ok = builtins::contains(right, left) == (op == Op::In);
    else ok = builtins::compare(op, left, right);
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Evaluator::eval_slice(const Expr& e) {
  const Value obj = eval(*e.args[0]);
  if (obj.is_undefined()) builtins::fail_undefined(obj);
  std::optional<int64_t> part[3];
  for (int k = 0; k < 3; ++k) {
    const Expr* pe = e.args[static_cast<size_t>(k) + 1].get();
    if (!pe) continue;
    const Value v = eval(*pe);
    if (v.is_none()) continue;
    if (!v.is_int() && !v.is_bool()) return Value::undefined("slice indices must be integers");
    part[k] = v.as_int();
  }
  if (obj.is_string()) {
    const int64_t n = static_cast<int64_t>(pystr::length(obj.as_string()));
    return Value::string(pystr::slice(obj.as_string(), pystr::slice_indices(n, part[0], part[1], part[2])));
  }
  if (!obj.is_list()) return Value::undefined("'" + obj.type_name() + "' object is not subscriptable");
  const List& l = obj.as_list();
  const pystr::SliceIdx idx = pystr::slice_indices(static_cast<int64_t>(l.size()), part[0], part[1], part[2]);
  List out;
  out.reserve(idx.count());
  for (size_t i = 0, n = idx.count(); i < n; ++i) out.push_back(l[static_cast<size_t>(idx.at(i))]);
  return Value::list(std::move(out), obj.is_tuple());
}

void Evaluator::eval_args(const Expr& e, size_t first, CallArgs& out) {
  for (size_t i = first; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) out.kw.emplace_back(k, eval(*v));
}

Value Evaluator::eval_call(const Expr& e) {
  const Expr& callee = *e.args[0];
  if (callee.kind == ExprKind::Attr) {  // obj.method(...) without making a bound method
    const Value obj = eval(*callee.args[0]);
    if (obj.is_undefined()) builtins::fail_undefined(obj);
    if ((obj.is_string() || obj.is_list() || obj.is_dict()) && builtins::has_method(obj, callee.name)) {
      CallArgs a;
      eval_args(e, 1, a);
      line_ = e.line;
      return builtins::method(*this, obj, callee.name, a);
    }
    const Value fn = builtins::get_attr(obj, callee.name);
    CallArgs a;
    eval_args(e, 1, a);
    line_ = e.line;
    return call(fn, a);
  }
  const Value fn = eval(callee);
  CallArgs a;
  eval_args(e, 1, a);
  line_ = e.line;
  return call(fn, a);
}

Value Evaluator::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) builtins::fail_undefined(fn);
  if (!fn.is_callable()) throw EvalError("'" + fn.type_name() + "' object is not callable");
  return fn.as_callable().fn(*this, args);
}

}  // namespace ptllm::chat
