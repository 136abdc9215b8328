// The built-in chat templates of --chat-template NAME. Each renders what its model's own template
// renders for system/user/assistant conversations (tests/test_chat_templates.cpp compares them with
// the real ones in tests/data/chat_templates/); tokens are written out, not taken from the model's
// tokenizer, since a model that needs a built-in template often lacks that configuration too.
#include <array>

#include "chat/chat_template.h"

namespace ptllm::chat {

namespace {

struct Builtin {
  const char* name;
  const char* source;
};

// ChatML (<|im_start|>role ... <|im_end|>), no default system message.
constexpr const char* kChatml = R"TPL({#- ChatML: <|im_start|>role\ncontent<|im_end|>\n per message. #}
{#- A message's text: a string, or the text parts of a list of content parts. #}
{%- macro text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable %}
        {%- for part in content if part.type == 'text' %}
            {{- part.text }}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' }}
    {{- text(message.content) }}
    {{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TPL";

// Llama 3.1 Instruct without tools.
constexpr const char* kLlama3 = R"TPL({#- Llama 3.1 Instruct, without tools: a system header with the knowledge cutoff and the date. #}
{#- A message's text: a string, or the text parts of a list of content parts. #}
{%- macro text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable %}
        {%- for part in content if part.type == 'text' %}
            {{- part.text }}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if date_string is not defined %}
    {%- set date_string = '26 Jul 2024' %}
{%- endif %}
{%- if messages and messages[0].role == 'system' %}
    {%- set system_message = text(messages[0].content)|trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n' }}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: ' + date_string + '\n\n' }}
{{- system_message + '<|eot_id|>' }}
{%- for message in loop_messages %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' }}
    {{- text(message.content)|trim }}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

// Mistral Small 3.2 (the v7 format), with its default system message.
constexpr const char* kMistralV7 = R"TPL({#- Mistral Small 3.2 (the v7 format): [SYSTEM_PROMPT], [INST], no generation prompt; without a
    system message, Mistral's default one. #}
{#- A message's text: a string, or the text parts of a list of content parts. #}
{%- macro text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable %}
        {%- for part in content if part.type == 'text' %}
            {{- part.text }}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- set today = strftime_now('%Y-%m-%d') %}
{%- set default_system_message = "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered in Paris.\nYour knowledge base was last updated on 2023-10-01. The current date is " + today + ".\n\nWhen you're not sure about some information or when the user's request requires up-to-date or specific data, you must use the available tools to fetch the information. Do not hesitate to use tools whenever they can provide a more accurate or complete response. If no relevant tools are available, then clearly state that you don't have the information and avoid making up anything.

If the user's question is not clear, ambiguous, or does not provide enough context for you to accurately answer the question, you do not try to answer it right away and you rather ask the user to clarify their request (e.g. \"What are some good restaurants around me?\" => \"Where are you?\" or \"When is the next flight to Tokyo\" => \"Where do you travel from?\").
You are always very attentive to dates, and when asked about information at specific dates, you discard information that is at another date.
You follow these instructions in all languages, and always respond to the user in the language they use or request.
Next sections describe the capabilities that you have.

# WEB BROWSING INSTRUCTIONS

You cannot perform any web search or access internet to open URLs, links etc. If it seems like the user is expecting you to do so, you clarify the situation and ask the user to copy paste the text directly in the chat.

# MULTI-MODAL INSTRUCTIONS

You have the ability to read images, but you cannot generate images. You also cannot transcribe audio files or videos.
You cannot read nor transcribe audio files or videos.

# TOOL CALLING INSTRUCTIONS

You may have access to tools that you can use to fetch information or perform actions. You must use these tools in the following situations:

1. When the request requires up-to-date information.
2. When the request requires specific data that you do not have in your knowledge base.
3. When the request involves actions that you cannot perform without tools.

Always prioritize using tools to provide the most accurate and helpful response. If tools are not available, inform the user that you cannot perform the requested action at the moment." %}
{%- if messages and messages[0].role == 'system' %}
    {%- set system_prompt = text(messages[0].content) %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_prompt = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<s>[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }}
{%- for message in loop_messages %}
    {%- if message.role == 'system' %}
        {{- '[SYSTEM_PROMPT]' }}
        {{- text(message.content) }}
        {{- '[/SYSTEM_PROMPT]' }}
    {%- elif message.role == 'user' %}
        {{- '[INST]' }}
        {{- text(message.content) }}
        {{- '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        {{- text(message.content) }}
        {{- '</s>' }}
    {%- endif %}
{%- endfor %}
)TPL";

// Qwen2.5 Instruct's own template, tools included.
constexpr const char* kQwen25 = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TPL";

// Gemma 3 (a system message opens the first user turn).
constexpr const char* kGemma = R"TPL({#- Gemma 3: no system role; a system message opens the first user turn. #}
{#- A message's text: a string, or the text parts of a list of content parts. #}
{%- macro text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable %}
        {%- for part in content if part.type == 'text' %}
            {{- part.text }}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if messages and messages[0].role == 'system' %}
    {%- set first_user_prefix = text(messages[0].content) + '\n\n' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set first_user_prefix = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<bos>' }}
{%- for message in loop_messages %}
    {{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' }}
    {%- if loop.first %}
        {{- first_user_prefix }}
    {%- endif %}
    {{- text(message.content)|trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\n' }}
{%- endif %}
)TPL";

// Phi-3.5 mini Instruct.
constexpr const char* kPhi3 = R"TPL({#- Phi-3 / Phi-3.5 mini: <|role|>\ncontent<|end|>\n; an empty system message is left out. #}
{#- A message's text: a string, or the text parts of a list of content parts. #}
{%- macro text(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable %}
        {%- for part in content if part.type == 'text' %}
            {{- part.text }}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- for message in messages %}
    {%- if message.role in ['system', 'user', 'assistant'] and (message.role != 'system' or message.content) %}
        {{- '<|' + message.role + '|>\n' }}
        {{- text(message.content) }}
        {{- '<|end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>\n' }}
{%- else %}
    {{- '<|endoftext|>' }}
{%- endif %}
)TPL";

constexpr std::array<Builtin, 6> kBuiltins = {{
    {"chatml", kChatml},
    {"llama3", kLlama3},
    {"mistral-v7", kMistralV7},
    {"qwen2.5", kQwen25},
    {"gemma", kGemma},
    {"phi3", kPhi3},
}};


}  // namespace

std::vector<std::string> builtin_template_names() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.emplace_back(b.name);
  return names;
}

const char* builtin_template_source(std::string_view name) {
  for (const Builtin& b : kBuiltins)
    if (name == b.name) return b.source;
  return nullptr;
}

}  // namespace ptllm::chat
