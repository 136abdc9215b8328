#pragma once
// Tokens -> AST, following Jinja2's parser.py precedence: conditional < or < and < not <
// comparisons (chained, in, not in) < + - < ~ < * / // % < ** < unary - + < postfix (. [] ())
// with filters (|) and tests (is) binding to the unary operand.
#include <string>
#include <string_view>

#include "chat/ast.h"

namespace ptllm::chat {

// Throws TemplateError naming the template and line on any syntax error. Nesting of
// expressions and blocks is bounded, so hostile input fails cleanly instead of exhausting the
// stack.
Program parse_template(std::string_view source, const std::string& template_name);

}  // namespace ptllm::chat
