#!/usr/bin/env python3
"""Expected renderings of the real chat templates, by Jinja2 set up as transformers does.

transformers' apply_chat_template (src/transformers/utils/chat_template_utils.py,
_compile_jinja_template and render_jinja_template) builds an ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loopcontrols extension plus a `generation` tag,
replaces the tojson filter (no HTML escaping; ensure_ascii, indent, separators, sort_keys) and adds
the globals raise_exception and strftime_now, then renders with messages, tools (None when there
are none), documents=None, add_generation_prompt, the tokenizer's special tokens and the extra
keyword arguments. This script does the same without transformers, with strftime_now frozen at
FIXED_NOW so that the outputs do not depend on the day (the C++ test sets the same clock).

Reads tests/data/chat_templates/*.jinja (with manifest.json: the special tokens of each model)
and tests/data/chat_cases.jsonl; writes tests/data/chat_expected.jsonl, one line per
(template, case): {"template", "case", "output"} or {"template", "case", "error"}.
Also renders the interpreter's unit cases, tests/data/chat_unit_cases.json (snippets of every tag,
filter, test and operator, and templates Jinja2 refuses), into tests/data/chat_unit_expected.jsonl.
The C++ test (tests/test_chat_templates.cpp) compares byte for byte. Run it from the repository
root after changing a case or a template:  python3 scripts/render_chat_templates.py
"""
import json
import pathlib
from datetime import datetime, timezone

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
FIXED_NOW = 1721995200  # 2024-07-26 12:00:00 UTC; also kChatFixedNow in the C++ test


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %} renders its body (transformers' AssistantTracker
    also records the span, which rendering does not need)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.fromtimestamp(FIXED_NOW, timezone.utc).strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template, tokens, case):
    context = dict(tokens)
    context.update(case.get("kwargs", {}))
    context.update(messages=case["messages"], tools=case.get("tools"), documents=None,
                   add_generation_prompt=case.get("add_generation_prompt", False))
    return template.render(**context)


def main():
    env = environment()
    manifest = json.loads((DATA / "chat_templates" / "manifest.json").read_text(encoding="utf-8"))
    cases = [json.loads(line) for line in (DATA / "chat_cases.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    for name in sorted(manifest):
        source = (DATA / "chat_templates" / name).read_text(encoding="utf-8")
        template = env.from_string(source)
        for case in cases:
            row = {"template": name, "case": case["name"]}
            try:
                row["output"] = render(template, manifest[name], case)
            except Exception as e:  # a case the template refuses; the C++ side must refuse it too
                row["error"] = str(e)
            out.append(json.dumps(row, ensure_ascii=False))
    (DATA / "chat_expected.jsonl").write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"{len(out)} renderings of {len(manifest)} templates x {len(cases)} cases")

    units = json.loads((DATA / "chat_unit_cases.json").read_text(encoding="utf-8"))
    out = []
    for case in units:
        row = dict(case)
        try:
            row["output"] = env.from_string(case["template"]).render(**case["context"])
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        out.append(json.dumps(row, ensure_ascii=False))
    (DATA / "chat_unit_expected.jsonl").write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"{len(out)} unit cases")


if __name__ == "__main__":
    main()
