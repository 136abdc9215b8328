#pragma once
// Internal to parser.cpp (statements) and parser_expr.cpp (expressions).
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace ptllm::chat::detail {

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}
  Body parse_all();

 private:
  // Statements (parser.cpp).
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string* found);
  StmtPtr parse_tag();
  StmtPtr parse_if(int line);
  StmtPtr parse_for(int line);
  StmtPtr parse_set(int line);
  StmtPtr parse_macro(int line);
  StmtPtr parse_call_block(int line);
  StmtPtr parse_filter_block(int line);
  StmtPtr parse_with(int line);
  std::vector<std::string> parse_names();  // a, b  or  (a, b)
  void parse_params(Stmt& s);              // (a, b=1)
  void end_tag();

  // Expressions (parser_expr.cpp).
 public:
  ExprPtr parse_expression(bool with_cond = true);
  ExprPtr parse_tuple(bool explicit_parens = false, bool with_cond = true);

 private:
  ExprPtr parse_cond();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_filter(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);
  void parse_call_args(Expr& call);
  ExprPtr parse_list();
  ExprPtr parse_dict();

 public:
  // Token helpers.
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::Name && cur().text == n; }
  Token next() { return pos_ + 1 < t_.size() ? t_[pos_++] : t_[pos_]; }
  void expect_op(std::string_view op);
  std::string expect_name();
  [[noreturn]] void fail(const std::string& msg) const;
  [[noreturn]] void fail_unexpected(const std::string& expected) const;
  ExprPtr node(ExprKind k, int line) const;

  struct DepthGuard {  // bounds recursion: nested brackets, unary chains, nested blocks
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth) p_.fail("template nesting too deep");
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };
  static constexpr int kMaxDepth = 200;

 private:
  std::vector<Token> t_;
  const std::string& name_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // break / continue are only legal inside a for
};

std::string describe(const Token& t);

}  // namespace ptllm::chat::detail
