// Statements: {% if %}, {% for %}, {% set %}, {% macro %}, {% call %}, {% filter %}, {% with %},
// {% break %} / {% continue %} (loopcontrols) and {% generation %} (transformers).
#include "chat/parser.h"

#include <algorithm>

#include "chat/parser_impl.h"

namespace ptllm::chat {

namespace detail {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "template data";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "'}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "'%}'";
    case Tok::Name: return "'" + t.text + "'";
    case Tok::String: return "string";
    case Tok::Int:
    case Tok::Float: return "number";
    case Tok::Op: return "'" + t.text + "'";
    case Tok::Eof: return "end of template";
  }
  return "token";
}

void Parser::fail(const std::string& msg) const { throw TemplateError(name_, cur().line, msg); }

void Parser::fail_unexpected(const std::string& expected) const {
  fail("expected " + expected + ", got " + describe(cur()));
}

void Parser::expect_op(std::string_view op) {
  if (!is_op(op)) fail_unexpected("'" + std::string(op) + "'");
  next();
}

std::string Parser::expect_name() {
  if (cur().type != Tok::Name) fail_unexpected("a name");
  return next().text;
}

ExprPtr Parser::node(ExprKind k, int line) const {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->line = line;
  return e;
}

void Parser::end_tag() {
  if (cur().type != Tok::BlockEnd) fail_unexpected("end of statement block");
  next();
}

Body Parser::parse_all() {
  std::string found;
  Body b = parse_body({}, &found);
  if (cur().type != Tok::Eof) fail("unexpected '" + found + "'");
  return b;
}

// Statements up to one of `end_tags` (left as the current token's name: the caller consumes it).
Body Parser::parse_body(std::initializer_list<std::string_view> end_tags, std::string* found) {
  DepthGuard guard(*this);
  Body body;
  while (cur().type != Tok::Eof) {
    const Token& t = cur();
    if (t.type == Tok::Data) {
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::Text;
      s->line = t.line;
      s->text = next().text;
      body.push_back(std::move(s));
    } else if (t.type == Tok::VarBegin) {
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::Output;
      s->line = next().line;
      s->expr = parse_tuple();
      if (cur().type != Tok::VarEnd) fail_unexpected("end of print statement");
      next();
      body.push_back(std::move(s));
    } else if (t.type == Tok::BlockBegin) {
      const Token& name = peek();
      if (name.type == Tok::Name &&
          std::find(end_tags.begin(), end_tags.end(), name.text) != end_tags.end()) {
        next();
        *found = name.text;
        return body;
      }
      next();
      body.push_back(parse_tag());
    } else {
      fail_unexpected("template data or a tag");
    }
  }
  if (end_tags.size() > 0) {
    std::string want;
    for (auto t : end_tags) want += (want.empty() ? "'" : " or '") + std::string(t) + "'";
    fail("unexpected end of template, expected " + want);
  }
  return body;
}

StmtPtr Parser::parse_tag() {
  if (cur().type != Tok::Name) fail_unexpected("a tag name");
  const int line = cur().line;
  const std::string tag = next().text;
  if (tag == "if") return parse_if(line);
  if (tag == "for") return parse_for(line);
  if (tag == "set") return parse_set(line);
  if (tag == "macro") return parse_macro(line);
  if (tag == "call") return parse_call_block(line);
  if (tag == "filter") return parse_filter_block(line);
  if (tag == "with") return parse_with(line);
  auto s = std::make_unique<Stmt>();
  s->line = line;
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) fail("'" + tag + "' outside of a loop");
    s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
    end_tag();
    return s;
  }
  if (tag == "generation") {
    s->kind = StmtKind::Generation;
    end_tag();
    std::string found;
    s->body = parse_body({"endgeneration"}, &found);
    next();
    end_tag();
    return s;
  }
  static const char* const kEnds[] = {"elif", "else", "endif", "endfor", "endset", "endmacro",
                                      "endcall", "endfilter", "endwith", "endgeneration", "endraw"};
  for (const char* e : kEnds)
    if (tag == e) fail("unexpected '" + tag + "'");
  fail("unknown or unsupported tag '" + tag + "'");
}

StmtPtr Parser::parse_if(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::If;
  s->line = line;
  while (true) {
    Branch br;
    br.cond = parse_tuple(false, false);
    end_tag();
    std::string found;
    br.body = parse_body({"elif", "else", "endif"}, &found);
    next();
    s->branches.push_back(std::move(br));
    if (found == "elif") continue;
    if (found == "else") {
      end_tag();
      s->else_body = parse_body({"endif"}, &found);
      next();
    }
    end_tag();
    return s;
  }
}

std::vector<std::string> Parser::parse_names() {
  std::vector<std::string> names;
  const bool paren = is_op("(");
  if (paren) next();
  do {
    if (!names.empty()) next();  // the comma
    if (paren && is_op(")")) break;
    names.push_back(expect_name());
  } while (is_op(","));
  if (paren) expect_op(")");
  return names;
}

StmtPtr Parser::parse_for(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::For;
  s->line = line;
  s->targets = parse_names();
  if (!is_name("in")) fail_unexpected("'in'");
  next();
  s->expr = parse_tuple(false, false);
  if (is_name("if")) {
    next();
    s->cond = parse_expression();
  }
  if (is_name("recursive")) fail("recursive loops are not supported");
  end_tag();
  std::string found;
  ++loop_depth_;
  s->body = parse_body({"endfor", "else"}, &found);
  --loop_depth_;
  next();
  if (found == "else") {
    end_tag();
    s->else_body = parse_body({"endfor"}, &found);
    next();
  }
  end_tag();
  return s;
}

StmtPtr Parser::parse_set(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::Set;
  s->line = line;
  if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
    s->targets.push_back(next().text);
    next();
    s->ns_attr = expect_name();
  } else {
    s->targets = parse_names();
  }
  if (is_op("=")) {
    next();
    s->expr = parse_tuple();
    end_tag();
    return s;
  }
  if (!s->ns_attr.empty() || s->targets.size() != 1) fail_unexpected("'='");
  s->kind = StmtKind::SetBlock;
  if (is_op("|")) {
    s->expr = parse_filter(nullptr);
    while (is_op("|")) s->expr = parse_filter(std::move(s->expr));
  }
  end_tag();
  // A block set does not see break/continue of an enclosing loop (Jinja2 scopes it).
  const int saved = std::exchange(loop_depth_, 0);
  std::string found;
  s->body = parse_body({"endset"}, &found);
  loop_depth_ = saved;
  next();
  end_tag();
  return s;
}

void Parser::parse_params(Stmt& s) {
  expect_op("(");
  while (!is_op(")")) {
    if (!s.targets.empty()) expect_op(",");
    if (is_op(")")) break;
    s.targets.push_back(expect_name());
    if (is_op("=")) {
      next();
      s.exprs.push_back(parse_expression());
    } else {
      if (std::any_of(s.exprs.begin(), s.exprs.end(), [](const ExprPtr& e) { return e != nullptr; }))
        fail("non-default argument follows default argument");
      s.exprs.push_back(nullptr);
    }
  }
  next();
}

StmtPtr Parser::parse_macro(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::Macro;
  s->line = line;
  s->text = expect_name();
  parse_params(*s);
  end_tag();
  const int saved = std::exchange(loop_depth_, 0);
  std::string found;
  s->body = parse_body({"endmacro"}, &found);
  loop_depth_ = saved;
  next();
  end_tag();
  return s;
}

StmtPtr Parser::parse_call_block(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::CallBlock;
  s->line = line;
  if (is_op("(")) parse_params(*s);
  s->expr = parse_expression();
  if (s->expr->kind != ExprKind::Call) fail("expected a call after 'call'");
  end_tag();
  const int saved = std::exchange(loop_depth_, 0);
  std::string found;
  s->body = parse_body({"endcall"}, &found);
  loop_depth_ = saved;
  next();
  end_tag();
  return s;
}

StmtPtr Parser::parse_filter_block(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::FilterBlock;
  s->line = line;
  // `{% filter upper | trim %}`: a chain of filters over the body's text.
  s->expr = parse_filter(nullptr);
  while (is_op("|")) s->expr = parse_filter(std::move(s->expr));
  end_tag();
  std::string found;
  s->body = parse_body({"endfilter"}, &found);
  next();
  end_tag();
  return s;
}

StmtPtr Parser::parse_with(int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::With;
  s->line = line;
  while (cur().type != Tok::BlockEnd) {
    if (!s->targets.empty()) expect_op(",");
    s->targets.push_back(expect_name());
    expect_op("=");
    s->exprs.push_back(parse_expression());
  }
  end_tag();
  std::string found;
  s->body = parse_body({"endwith"}, &found);
  next();
  end_tag();
  return s;
}

}  // namespace detail

Program parse_template(std::string_view source, const std::string& template_name) {
  Program p;
  p.name = template_name;
  detail::Parser parser(tokenize(source, template_name), p.name);
  p.body = parser.parse_all();
  return p;
}

}  // namespace ptllm::chat
