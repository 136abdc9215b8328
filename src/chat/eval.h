#pragma once
// The evaluator: walks a Program over a context of values and writes the output, with Jinja2's
// scoping (a for body and a macro body are scopes of their own, an if is not), its Undefined
// (prints empty, iterates empty, fails on arithmetic and on attribute access) and limits on
// work, output size and call depth so that no template can hang or exhaust memory.
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"

namespace ptllm::chat {

struct RenderOptions {
  // strftime_now's clock: the UTC fields of this time; unset = the local time now (Python's
  // datetime.now()). Tests set it, since Llama 3.x and Mistral Small print today's date.
  std::optional<std::time_t> now;
  size_t max_output_bytes = size_t{64} << 20;
  uint64_t max_steps = 50'000'000;  // evaluated nodes; a runaway loop fails instead of hanging
};

// Renders `program` with `context` as its variables (on top of the globals: range, namespace,
// dict, raise_exception, strftime_now). Throws TemplateError (template name and line).
std::string render(const Program& program, const Dict& context, const RenderOptions& opt = {});

enum class Flow : uint8_t { Normal, Break, Continue };

class Evaluator {
 public:
  Evaluator(const Program& p, const RenderOptions& opt) : prog_(p), opt_(opt) {}
  std::string run(const Dict& context);

  // For builtins (builtins.cpp).
  Value call(const Value& fn, CallArgs& args);
  const RenderOptions& options() const { return opt_; }
  const std::string& template_name() const { return prog_.name; }
  void check_size(size_t bytes) const;

 private:
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    size_t parent;  // index of the enclosing frame; SIZE_MAX for the root
  };

  Flow exec(const Body& body, std::string& out);
  Flow exec_stmt(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  void exec_call_block(const Stmt& s, std::string& out);
  Value apply_filters(const Expr& chain, Value v);
  Value make_macro(const Stmt& s);
  Value call_macro(const Stmt& s, CallArgs& args);

  Value eval(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_slice(const Expr& e);
  void eval_args(const Expr& e, size_t first, CallArgs& out);

  const Value* lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void assign_targets(const std::vector<std::string>& names, const Value& v);
  void step();
  [[noreturn]] void fail(int line, const std::string& msg) const;

  const Program& prog_;
  const RenderOptions& opt_;
  std::vector<Frame> frames_;
  size_t current_ = 0;  // index of the innermost frame
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 0;  // of the node being evaluated, for errors thrown by builtins
};

}  // namespace ptllm::chat
