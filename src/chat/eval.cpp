// Statements and scopes. Expressions are in eval_expr.cpp.
#include "chat/eval.h"

#include <cstdint>

#include "chat/builtins.h"

namespace ptllm::chat {

namespace {

constexpr int kMaxCallDepth = 40;  // macro recursion; each level is a few dozen C++ frames

Value loop_object(const List& items, size_t i) {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t k = static_cast<int64_t>(i);
  Dict d;
  d.items.reserve(12);
  d.items.emplace_back(Value::string("index"), Value::integer(k + 1));
  d.items.emplace_back(Value::string("index0"), Value::integer(k));
  d.items.emplace_back(Value::string("revindex"), Value::integer(n - k));
  d.items.emplace_back(Value::string("revindex0"), Value::integer(n - k - 1));
  d.items.emplace_back(Value::string("first"), Value::boolean(i == 0));
  d.items.emplace_back(Value::string("last"), Value::boolean(k == n - 1));
  d.items.emplace_back(Value::string("length"), Value::integer(n));
  d.items.emplace_back(Value::string("depth"), Value::integer(1));
  d.items.emplace_back(Value::string("depth0"), Value::integer(0));
  d.items.emplace_back(Value::string("previtem"), i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  d.items.emplace_back(Value::string("nextitem"), k + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  d.items.emplace_back(Value::string("cycle"), Value::callable("loop.cycle", [i](Evaluator&, CallArgs& a) {
    if (a.pos.empty()) throw EvalError("no items for cycling given");
    return a.pos[i % a.pos.size()];
  }));
  return Value::dict(std::move(d));
}

}  // namespace

std::string render(const Program& program, const Dict& context, const RenderOptions& opt) {
  Evaluator ev(program, opt);
  return ev.run(context);
}

void Evaluator::fail(int line, const std::string& msg) const {
  throw TemplateError(prog_.name, line, msg);
}

void Evaluator::step() {
  if (++steps_ > opt_.max_steps) throw EvalError("template exceeded its evaluation budget");
}

void Evaluator::check_size(size_t bytes) const {
  if (bytes > opt_.max_output_bytes) throw EvalError("template output exceeds the size limit");
}

std::string Evaluator::run(const Dict& context) {
  frames_.clear();
  frames_.push_back({{}, SIZE_MAX});
  for (const auto& [k, v] : context.items)
    if (k.is_string()) frames_.back().vars.emplace_back(k.as_string(), v);
  current_ = 0;
  std::string out;
  try {
    exec(prog_.body, out);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& e) {  // EvalError from builtins; anything else is reported alike
    fail(line_, e.what());
  }
  return out;
}

const Value* Evaluator::lookup(const std::string& name) const {
  for (size_t f = current_; f != SIZE_MAX; f = frames_[f].parent)
    for (const auto& [k, v] : frames_[f].vars)
      if (k == name) return &v;
  return nullptr;
}

void Evaluator::assign(const std::string& name, Value v) {
  for (auto& [k, old] : frames_[current_].vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  frames_[current_].vars.emplace_back(name, std::move(v));
}

void Evaluator::assign_targets(const std::vector<std::string>& names, const Value& v) {
  if (names.size() == 1) {
    assign(names[0], v);
    return;
  }
  const List items = builtins::iterate(v);
  if (items.size() != names.size())
    throw EvalError("cannot unpack " + std::to_string(items.size()) + " values into " +
                    std::to_string(names.size()) + " names");
  for (size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
}

Flow Evaluator::exec(const Body& body, std::string& out) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Flow Evaluator::exec_stmt(const Stmt& s, std::string& out) {
  step();
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::Text: out += s.text; break;
    case StmtKind::Output: {
      const Value v = eval(*s.expr);
      out += v.str();
      break;
    }
    case StmtKind::If:
      for (const auto& br : s.branches)
        if (eval(*br.cond).truthy()) return exec(br.body, out);
      return exec(s.else_body, out);
    case StmtKind::For: return exec_for(s, out);
    case StmtKind::Set: exec_set(s); break;
    case StmtKind::SetBlock: {
      std::string text;
      exec(s.body, text);
      Value v = Value::string(std::move(text));
      if (s.expr) v = apply_filters(*s.expr, std::move(v));  // {% set x | f %}
      assign(s.targets[0], std::move(v));
      break;
    }
    case StmtKind::Macro: assign(s.text, make_macro(s)); break;
    case StmtKind::CallBlock: exec_call_block(s, out); break;
    case StmtKind::FilterBlock: {
      std::string text;
      exec(s.body, text);
      out += apply_filters(*s.expr, Value::string(std::move(text))).str();
      break;
    }
    case StmtKind::With: {
      std::vector<Value> vals;
      for (const auto& e : s.exprs) vals.push_back(eval(*e));
      frames_.push_back({{}, current_});
      const size_t saved = std::exchange(current_, frames_.size() - 1);
      for (size_t i = 0; i < s.targets.size(); ++i) assign(s.targets[i], vals[i]);
      const Flow f = exec(s.body, out);
      frames_.pop_back();
      current_ = saved;
      return f;
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
    case StmtKind::Generation: return exec(s.body, out);
  }
  check_size(out.size());
  return Flow::Normal;
}

Flow Evaluator::exec_for(const Stmt& s, std::string& out) {
  const Value seq = eval(*s.expr);
  if (!seq.is_undefined() && !seq.is_list() && !seq.is_dict() && !seq.is_string() && !seq.is_namespace())
    throw EvalError("'" + seq.type_name() + "' object is not iterable");
  List items = builtins::iterate(seq);
  frames_.push_back({{}, current_});
  const size_t saved = std::exchange(current_, frames_.size() - 1);
  if (s.cond) {  // `for x in xs if cond`: filtered first, so loop.index counts the kept items
    List kept;
    for (const auto& it : items) {
      frames_[current_].vars.clear();
      assign_targets(s.targets, it);
      if (eval(*s.cond).truthy()) kept.push_back(it);
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    step();                          // an empty body still costs: nested loops cannot run forever
    frames_[current_].vars.clear();  // each iteration a fresh scope, as Jinja2
    assign_targets(s.targets, items[i]);
    assign("loop", loop_object(items, i));
    if (exec(s.body, out) == Flow::Break) break;
  }
  frames_.pop_back();
  current_ = saved;
  if (items.empty()) return exec(s.else_body, out);
  return Flow::Normal;
}

void Evaluator::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (s.ns_attr.empty()) {
    assign_targets(s.targets, v);
    return;
  }
  const Value* ns = lookup(s.targets[0]);
  if (!ns || !ns->is_namespace()) throw EvalError("cannot assign attribute on non-namespace object");
  if (v.holds_namespace()) throw EvalError("a namespace cannot hold another namespace");
  ns->namespace_dict().set(s.ns_attr, std::move(v));
}

// A filter chain over `v` (the filter nodes of {% filter %} and {% set x | f %} have no operand).
Value Evaluator::apply_filters(const Expr& chain, Value v) {
  std::vector<const Expr*> filters;
  for (const Expr* f = &chain; f; f = f->args[0].get()) filters.push_back(f);
  for (auto it = filters.rbegin(); it != filters.rend(); ++it) {
    CallArgs a;
    eval_args(**it, 1, a);
    v = builtins::filter(*this, (*it)->name, v, a);
  }
  return v;
}

Value Evaluator::make_macro(const Stmt& s) {
  const Stmt* sp = &s;
  return Value::callable(s.text, [sp](Evaluator& ev, CallArgs& a) { return ev.call_macro(*sp, a); });
}

Value Evaluator::call_macro(const Stmt& s, CallArgs& args) {
  if (call_depth_ >= kMaxCallDepth) throw EvalError("maximum macro recursion depth exceeded");
  if (args.pos.size() > s.targets.size())
    throw EvalError("macro '" + s.text + "' takes not more than " + std::to_string(s.targets.size()) +
                    " argument(s)");
  frames_.push_back({{}, 0});  // a macro sees its arguments and the template's top level
  const size_t saved = std::exchange(current_, frames_.size() - 1);
  const int saved_line = line_;
  ++call_depth_;
  std::string out;
  for (size_t i = 0; i < s.targets.size(); ++i) {
    const Value* given = args.get(i, s.targets[i]);
    if (given) assign(s.targets[i], *given);
    else if (s.exprs[i]) assign(s.targets[i], eval(*s.exprs[i]));
    else assign(s.targets[i], Value::undefined("'" + s.targets[i] + "' is undefined"));
  }
  for (const auto& [k, v] : args.kw) {
    bool known = k == "caller";
    for (const auto& t : s.targets) known = known || t == k;
    if (!known) throw EvalError("macro '" + s.text + "' takes no keyword argument '" + k + "'");
    if (k == "caller") assign(k, v);
  }
  exec(s.body, out);
  --call_depth_;
  frames_.pop_back();
  current_ = saved;
  line_ = saved_line;
  return Value::string(std::move(out));
}

void Evaluator::exec_call_block(const Stmt& s, std::string& out) {
  const Expr& call_expr = *s.expr;
  const Value fn = eval(*call_expr.args[0]);
  CallArgs a;
  eval_args(call_expr, 1, a);
  const Stmt* sp = &s;
  const size_t site = current_;
  a.kw.emplace_back("caller", Value::callable("caller", [sp, site](Evaluator& ev, CallArgs& ca) {
    ev.frames_.push_back({{}, site});
    const size_t saved = std::exchange(ev.current_, ev.frames_.size() - 1);
    for (size_t i = 0; i < sp->targets.size(); ++i) {
      const Value* given = ca.get(i, sp->targets[i]);
      ev.assign(sp->targets[i], given ? *given : sp->exprs[i] ? ev.eval(*sp->exprs[i]) : Value::undefined());
    }
    std::string text;
    ev.exec(sp->body, text);
    ev.frames_.pop_back();
    ev.current_ = saved;
    return Value::string(std::move(text));
  }));
  out += call(fn, a).str();
}

}  // namespace ptllm::chat
