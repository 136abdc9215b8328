// Expressions, one function per precedence level of Jinja2's parser.py.
#include "chat/parser_impl.h"

namespace ptllm::chat::detail {

namespace {

ExprPtr binary(Parser& p, Op op, ExprPtr l, ExprPtr r, int line) {
  ExprPtr e = p.node(ExprKind::Binary, line);
  e->op = op;
  e->args.push_back(std::move(l));
  e->args.push_back(std::move(r));
  return e;
}

bool tuple_end(const Parser& p) {
  const Tok t = p.cur().type;
  return t == Tok::VarEnd || t == Tok::BlockEnd || (t == Tok::Op && p.cur().text == ")") ||
         t == Tok::Eof;
}

}  // namespace

ExprPtr Parser::parse_expression(bool with_cond) { return with_cond ? parse_cond() : parse_or(); }

// `a, b` is a tuple; `(a)` is a; `()` is the empty tuple.
ExprPtr Parser::parse_tuple(bool explicit_parens, bool with_cond) {
  const int line = cur().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (tuple_end(*this)) break;
    items.push_back(parse_expression(with_cond));
    if (is_op(",")) is_tuple = true;
    else break;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) fail_unexpected("an expression");
  }
  ExprPtr e = node(ExprKind::Tuple, line);
  e->args = std::move(items);
  return e;
}

ExprPtr Parser::parse_cond() {
  DepthGuard guard(*this);
  ExprPtr e = parse_or();
  while (is_name("if")) {
    const int line = next().line;
    ExprPtr c = node(ExprKind::Cond, line);
    ExprPtr test = parse_or();
    ExprPtr other;
    if (is_name("else")) {
      next();
      other = parse_cond();
    }
    c->args.push_back(std::move(e));
    c->args.push_back(std::move(test));
    c->args.push_back(std::move(other));
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (is_name("or")) {
    const int line = next().line;
    e = binary(*this, Op::Or, std::move(e), parse_and(), line);
  }
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (is_name("and")) {
    const int line = next().line;
    e = binary(*this, Op::And, std::move(e), parse_not(), line);
  }
  return e;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this);
    ExprPtr e = node(ExprKind::Unary, next().line);
    e->op = Op::Not;
    e->args.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const int line = cur().line;
  ExprPtr first = parse_math1();
  ExprPtr e;
  while (true) {
    Op op;
    if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
      const std::string& t = cur().text;
      op = t == "==" ? Op::Eq : t == "!=" ? Op::Ne : t == "<" ? Op::Lt : t == ">" ? Op::Gt : t == "<=" ? Op::Le : Op::Ge;
      next();
    } else if (is_name("in")) {
      op = Op::In;
      next();
    } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
      op = Op::NotIn;
      next();
      next();
    } else {
      break;
    }
    if (!e) {
      e = node(ExprKind::Compare, line);
      e->args.push_back(std::move(first));
    }
    e->ops.push_back(op);
    e->args.push_back(parse_math1());
  }
  return e ? std::move(e) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token t = next();
    e = binary(*this, t.text == "+" ? Op::Add : Op::Sub, std::move(e), parse_concat(), t.line);
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  const int line = cur().line;
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  ExprPtr e = node(ExprKind::Concat, line);
  e->args.push_back(std::move(first));
  while (is_op("~")) {
    next();
    e->args.push_back(parse_math2());
  }
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token t = next();
    const Op op = t.text == "*" ? Op::Mul : t.text == "/" ? Op::Div : t.text == "//" ? Op::FloorDiv : Op::Mod;
    e = binary(*this, op, std::move(e), parse_pow(), t.line);
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (is_op("**")) {
    const int line = next().line;
    e = binary(*this, Op::Pow, std::move(e), parse_unary(true), line);
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    const Token t = next();
    e = node(ExprKind::Unary, t.line);
    e->op = t.text == "-" ? Op::Neg : Op::Pos;
    e->args.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  const int line = t.line;
  if (t.type == Tok::Name) {
    const std::string n = next().text;
    ExprPtr e = node(ExprKind::Literal, line);
    if (n == "true" || n == "True") e->value = Value::boolean(true);
    else if (n == "false" || n == "False") e->value = Value::boolean(false);
    else if (n == "none" || n == "None") e->value = Value::none();
    else {
      e->kind = ExprKind::Name;
      e->name = n;
    }
    return e;
  }
  if (t.type == Tok::String) {
    std::string s;
    while (cur().type == Tok::String) s += next().text;  // 'a' 'b' is 'ab', as in Python
    ExprPtr e = node(ExprKind::Literal, line);
    e->value = Value::string(std::move(s));
    return e;
  }
  if (t.type == Tok::Int || t.type == Tok::Float) {
    const Token n = next();
    ExprPtr e = node(ExprKind::Literal, line);
    e->value = n.type == Tok::Int ? Value::integer(n.ival) : Value::real(n.fval);
    return e;
  }
  if (is_op("(")) {
    next();
    ExprPtr e = parse_tuple(true);
    expect_op(")");
    return e;
  }
  if (is_op("[")) return parse_list();
  if (is_op("{")) return parse_dict();
  fail("unexpected " + describe(t));
}

ExprPtr Parser::parse_list() {
  ExprPtr e = node(ExprKind::List, next().line);
  while (!is_op("]")) {
    if (!e->args.empty()) expect_op(",");
    if (is_op("]")) break;
    e->args.push_back(parse_expression());
  }
  next();
  return e;
}

ExprPtr Parser::parse_dict() {
  ExprPtr e = node(ExprKind::Dict, next().line);
  while (!is_op("}")) {
    if (!e->args.empty()) expect_op(",");
    if (is_op("}")) break;
    e->args.push_back(parse_expression());
    expect_op(":");
    e->args.push_back(parse_expression());
  }
  next();
  return e;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      ExprPtr c = node(ExprKind::Call, cur().line);
      c->args.push_back(std::move(e));
      parse_call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  while (true) {
    if (is_op("|")) {
      e = parse_filter(std::move(e));
    } else if (is_name("is")) {
      e = parse_test(std::move(e));
    } else if (is_op("(")) {
      ExprPtr c = node(ExprKind::Call, cur().line);
      c->args.push_back(std::move(e));
      parse_call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr obj) {
  DepthGuard guard(*this);
  const Token t = next();
  if (t.text == ".") {
    if (cur().type == Tok::Int) {  // foo.0 is foo[0]
      ExprPtr e = node(ExprKind::Item, t.line);
      ExprPtr idx = node(ExprKind::Literal, t.line);
      idx->value = Value::integer(next().ival);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(idx));
      return e;
    }
    ExprPtr e = node(ExprKind::Attr, t.line);
    e->name = expect_name();
    e->args.push_back(std::move(obj));
    return e;
  }
  std::vector<ExprPtr> subs;
  while (!is_op("]")) {
    if (!subs.empty()) expect_op(",");
    subs.push_back(parse_subscribed());
  }
  next();
  if (subs.empty()) fail("expected a subscript");
  ExprPtr sub;
  if (subs.size() == 1) {
    sub = std::move(subs[0]);
  } else {
    sub = node(ExprKind::Tuple, t.line);
    sub->args = std::move(subs);
  }
  if (sub->kind == ExprKind::Slice) {  // the slice node takes the object as args[0]
    sub->args[0] = std::move(obj);
    return sub;
  }
  ExprPtr e = node(ExprKind::Item, t.line);
  e->args.push_back(std::move(obj));
  e->args.push_back(std::move(sub));
  return e;
}

// One subscript: an expression, or a slice start:stop:step with any part left out.
ExprPtr Parser::parse_subscribed() {
  const int line = cur().line;
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression();
    if (!is_op(":")) return start;
  }
  next();
  ExprPtr e = node(ExprKind::Slice, line);
  e->args.push_back(nullptr);  // the object, filled by parse_subscript
  e->args.push_back(std::move(start));
  e->args.push_back(is_op("]") || is_op(",") || is_op(":") ? nullptr : parse_expression());
  ExprPtr step;
  if (is_op(":")) {
    next();
    if (!is_op("]") && !is_op(",")) step = parse_expression();
  }
  e->args.push_back(std::move(step));
  return e;
}

void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool first = true;
  while (!is_op(")")) {
    if (!first) expect_op(",");
    first = false;
    if (is_op(")")) break;
    if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
      std::string key = next().text;
      next();
      call.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call.kwargs.empty()) fail("positional argument follows keyword argument");
      call.args.push_back(parse_expression());
    }
  }
  next();
}

ExprPtr Parser::parse_filter(ExprPtr operand) {
  DepthGuard guard(*this);
  if (is_op("|")) next();
  ExprPtr e = node(ExprKind::Filter, cur().line);
  e->name = expect_name();
  while (is_op(".")) {
    next();
    e->name += "." + expect_name();
  }
  e->args.push_back(std::move(operand));
  if (is_op("(")) parse_call_args(*e);
  return e;
}

ExprPtr Parser::parse_test(ExprPtr operand) {
  DepthGuard guard(*this);
  ExprPtr e = node(ExprKind::Test, next().line);
  if (is_name("not")) {
    next();
    e->negated = true;
  }
  e->name = expect_name();
  while (is_op(".")) {
    next();
    e->name += "." + expect_name();
  }
  e->args.push_back(std::move(operand));
  const Token& t = cur();
  const bool arg_start = t.type == Tok::Name || t.type == Tok::String || t.type == Tok::Int ||
                         t.type == Tok::Float || is_op("[") || is_op("{");
  if (is_op("(")) {
    parse_call_args(*e);
  } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("You cannot chain multiple tests with is");
    e->args.push_back(parse_postfix(parse_primary()));  // `is divisibleby 3`
  }
  return e;
}

}  // namespace ptllm::chat::detail
