#pragma once
// The parsed template: expression and statement nodes (Jinja2's nodes.py, reduced to what chat
// templates use). One struct per family with a kind enum, so the evaluator dispatches on enums.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace ptllm::chat {

enum class ExprKind : uint8_t {
  Literal,  // value
  Name,     // name
  List,     // args: items
  Tuple,    // args: items
  Dict,     // args: key, value, key, value, ...
  Attr,     // args[0] . name
  Item,     // args[0] [ args[1] ]
  Slice,    // args[0] [ args[1] : args[2] : args[3] ] (absent parts null)
  Call,     // args[0] ( args[1..], kwargs )
  Filter,   // args[0] | name ( args[1..], kwargs ); args[0] null inside {% filter %}
  Test,     // args[0] is [not] name ( args[1..], kwargs )
  Unary,    // op args[0]
  Binary,   // args[0] op args[1]
  Compare,  // args[0] ops[0] args[1] ops[1] args[2] ... (Python's chained comparison)
  Concat,   // args joined with ~
  Cond,     // args[0] if args[1] else args[2] (args[2] null: Undefined)
};

enum class Op : uint8_t {
  Add, Sub, Mul, Div, FloorDiv, Mod, Pow,  // arithmetic
  And, Or, Not, Neg, Pos,                  // logic and unary
  Eq, Ne, Lt, Gt, Le, Ge, In, NotIn,       // comparisons
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::Literal;
  int line = 0;
  Op op = Op::Add;
  bool negated = false;  // Test: `is not`
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<Op> ops;  // Compare
};

enum class StmtKind : uint8_t {
  Text,         // text
  Output,       // {{ expr }}
  If,           // branches (cond, body)...; else_body
  For,          // targets in expr [if cond]: body; else_body
  Set,          // targets (or ns_attr on targets[0]) = expr
  SetBlock,     // {% set targets[0] %}body{% endset %}, optional filter in expr
  Macro,        // name(params = defaults): body
  CallBlock,    // {% call(params) expr %}body{% endcall %}: `caller()` renders body
  FilterBlock,  // {% filter expr %}body{% endfilter %}
  With,         // {% with targets = values %}body{% endwith %}
  Break,
  Continue,
  Generation,   // transformers' {% generation %}: renders its body
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Branch {
  ExprPtr cond;
  Body body;
};

struct Stmt {
  StmtKind kind = StmtKind::Text;
  int line = 0;
  std::string text;                  // Text; Macro: name
  std::string ns_attr;               // Set on a namespace attribute: targets[0].ns_attr = expr
  std::vector<std::string> targets;  // For / Set / With names; Macro / CallBlock params
  ExprPtr expr;                      // Output, For iterable, Set value, CallBlock call, filter
  ExprPtr cond;                      // For filter
  std::vector<ExprPtr> exprs;        // Macro defaults (null: none), With values
  std::vector<Branch> branches;      // If
  Body body;
  Body else_body;
};

struct Program {
  std::string name;  // for error messages
  Body body;
};

}  // namespace ptllm::chat
