#!/usr/bin/env python3
"""Writes tests/data/json_schemas/generated/*.json: schemas over every keyword that the JSON Schema
converter supports (src/grammar/json_schema.h), each with known valid and invalid instances.
Deterministic: the same files on every run.  Usage: tests/tools/gen_json_schemas.py"""
import json
import os
import random

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "json_schemas", "generated")
rng = random.Random(20261205)
cases = []


def add(name, schema, valid, invalid):
    cases.append((name, {"schema": schema, "valid": valid, "invalid": invalid}))


# Primitive schemas with values that validate and values that do not.
PRIMS = [
    ({"type": "string"}, ["", "hello", "with \"quote\" and \\ and \n", "\u00e9\u4e2d\U0001F600"], [1, None]),
    ({"type": "integer"}, [0, -3, 42], ["1", 1.5]),
    ({"type": "number"}, [0, 2.5, -1000.25], ["x", True]),
    ({"type": "boolean"}, [True, False], [0, "true"]),
    ({"type": "null"}, [None], [0, "null"]),
    ({"type": "string", "maxLength": 5}, ["abc", ""], ["abcdef"]),
    ({"type": "string", "minLength": 2}, ["ab"], ["a"]),
    ({"type": "integer", "minimum": 1, "maximum": 10}, [1, 10], [0, 11]),
    ({"type": "integer", "minimum": 0}, [0, 12345], [-1]),
    ({"type": "number", "minimum": 0, "maximum": 100}, [0, 99.5], [-1, 100.5]),
    ({"enum": ["a", "b", "c"]}, ["a", "c"], ["d"]),
    ({"type": "array", "items": {"type": "string"}}, [[], ["x", "y"]], [[1]]),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 3}, [[1, 2, 3]], [[1, 2, 3, 4]]),
    ({"type": "string", "format": "date"}, ["2024-05-01"], ["2024-13-01"]),
    ({"type": ["string", "null"]}, [None, "x"], [3]),
    ({"const": "fixed"}, ["fixed"], ["other"]),
    ({"type": "string", "pattern": "^[A-Z]{3}$"}, ["EUR"], ["eur"]),
]

# 1. string lengths
for lo, hi in [(0, 1), (1, 1), (0, 5), (2, 8), (3, None), (10, 20), (0, 0), (5, 5), (1, 64), (0, 100), (4, None), (0, 1000)]:
    s = {"type": "string"}
    if lo:
        s["minLength"] = lo
    if hi is not None:
        s["maxLength"] = hi
    valid = ["a" * lo, "\u00e9" * lo, "\n" * lo]
    if hi is not None:
        valid.append("x" * hi)
    else:
        valid.append("y" * (lo + 7))
    invalid = [7]
    if hi is not None:
        invalid.append("z" * (hi + 1))
    if lo > 0:
        invalid.append("q" * (lo - 1))
    add(f"string_length_{lo}_{hi}", s, valid, invalid)

# 2. integer ranges
for lo, hi, ex in [(0, 10, None), (-5, 5, None), (1, None, None), (None, 0, None), (-100, -1, None), (10, 99, None),
                   (100, 999, None), (0, 65535, None), (1, 12, None), (1900, 2100, None), (-2147483648, 2147483647, None),
                   (0, 1, None), (7, 7, None), (0, None, "min"), (None, 100, "max"), (-50, 50, "both"), (1, 1000000, None),
                   (-9, 9, None), (250, 260, None), (99999, 100001, None)]:
    s = {"type": "integer"}
    if ex in ("min", "both"):
        s["exclusiveMinimum"] = lo
        elo = lo + 1
    elif lo is not None:
        s["minimum"] = lo
        elo = lo
    else:
        elo = None
    if ex in ("max", "both"):
        s["exclusiveMaximum"] = hi
        ehi = hi - 1
    elif hi is not None:
        s["maximum"] = hi
        ehi = hi
    else:
        ehi = None
    valid = [v for v in [elo, ehi] if v is not None]
    if elo is not None and ehi is not None:
        valid.append((elo + ehi) // 2)
    if not valid or elo is None:
        valid.append((ehi if ehi is not None else 0) - 123)
    if ehi is None:
        valid.append((elo if elo is not None else 0) + 98765)
    invalid = ["1", 2.5]
    if elo is not None:
        invalid.append(elo - 1)
    if ehi is not None:
        invalid.append(ehi + 1)
    add(f"integer_range_{lo}_{hi}_{ex}", s, valid, invalid)

# 2b. number ranges (whole-number bounds)
for bounds, valid, invalid in [({"minimum": 0}, [0, 0.5, 1234.75], [-0.01, -3]),
                               ({"minimum": 0, "maximum": 1}, [0, 0.25, 1], [1.0001, -0.5]),
                               ({"exclusiveMinimum": 0, "maximum": 100}, [0.001, 100], [0, 100.5]),
                               ({"minimum": -90, "maximum": 90}, [-90, 45.123456, 90], [-90.5, 91]),
                               ({"minimum": -180, "exclusiveMaximum": 180}, [-180, 179.999], [180, -181]),
                               ({"exclusiveMinimum": -1, "exclusiveMaximum": 1}, [-0.999, 0, 0.5], [-1, 1]),
                               ({"maximum": 0}, [0, -12.5], [0.1]), ({"exclusiveMaximum": -10}, [-10.5, -1000], [-10, 0])]:
    add("number_range_" + "_".join(f"{k}{v}" for k, v in bounds.items()), {"type": "number", **bounds}, valid, invalid + ["1"])

# 3. numbers and type lists
add("number_plain", {"type": "number"}, [0, -0.5, 3.25, 100, 1.5e-7], ["1", None])
for types, valid, invalid in [(["string", "null"], ["x", None], [1]), (["integer", "string"], [3, "3"], [3.5, None]),
                              (["number", "boolean"], [1.5, True], ["x"]), (["array", "object"], [[], {}], [1]),
                              (["null", "boolean", "integer"], [None, False, -4], ["s", 0.5]),
                              (["string", "number", "boolean", "null"], ["a", 1, True, None], [[1], {}])]:
    add("type_list_" + "_".join(types), {"type": types}, valid, invalid)

# 4. enums and consts
ENUMS = [["red", "green", "blue"], ["celsius", "fahrenheit"], ["open", "closed", "all"], [1, 2, 3, 5, 8],
         ["asc", "desc"], ["a\"quoted\"", "back\\slash", "new\nline"], ["\u00e9t\u00e9", "\u4e2d\u6587", "emoji \U0001F600"],
         ["low", "medium", "high", "critical"], [True, None, 0, "0"], [{"a": 1}, [1, 2], "x"],
         ["GET", "POST", "PUT", "DELETE", "PATCH"], ["x", "xy", "xyz"]]
for i, e in enumerate(ENUMS):
    wrong = "nope" if "nope" not in e else 99
    add(f"enum_{i}", {"enum": e}, e, [wrong, "X" + json.dumps(e[0])])
    add(f"enum_in_object_{i}", {"type": "object", "properties": {"v": {"enum": e}}, "required": ["v"], "additionalProperties": False},
        [{"v": x} for x in e], [{"v": wrong}, {}])
for i, c in enumerate(["fixed", 42, True, None, {"kind": "k", "n": [1]}, "multi word const"]):
    add(f"const_{i}", {"const": c}, [c], ["other" if c != "other" else 1, [c]])

# 5. arrays of items
for i, (item, vals, bad) in enumerate(PRIMS):
    for lo, hi in [(0, None), (1, 3), (2, None)]:
        s = {"type": "array", "items": item}
        if lo:
            s["minItems"] = lo
        if hi is not None:
            s["maxItems"] = hi
        n = max(lo, 1)
        valid = [[vals[j % len(vals)] for j in range(n)]]
        if lo == 0:
            valid.append([])
        if hi is not None:
            valid.append([vals[j % len(vals)] for j in range(hi)])
        invalid = [[bad[0]] * n, {"not": "array"}]
        if lo > 0:
            invalid.append([vals[0]] * (lo - 1))
        if hi is not None:
            invalid.append([vals[0]] * (hi + 1))
        if i % 2 == 0 or lo == 1:
            add(f"array_{i}_{lo}_{hi}", s, valid, invalid)

# 6. tuples
for i in range(8):
    k = 1 + i % 4
    picks = [PRIMS[rng.randrange(len(PRIMS))] for _ in range(k)]
    s = {"type": "array", "prefixItems": [p[0] for p in picks]}
    full = [p[1][0] for p in picks]
    valid = [full, full[:1]]
    invalid = [[picks[0][2][0]] + full[1:]]
    if i % 2:
        s["minItems"] = k
        valid = [full]
        if k > 1:
            invalid.append(full[:-1])
    if i % 3 == 0:
        s["items"] = {"type": "boolean"}
        valid.append(full + [True, False])
        invalid.append(full + ["x"])
    else:
        s["items"] = False
        invalid.append(full + [None])
    add(f"tuple_{i}", s, valid, invalid)

# 7. objects
NAMES = ["id", "name", "email", "age", "tags", "active", "score", "created", "note", "count", "kind", "owner",
         "priority", "due", "url", "x", "y", "label", "value", "unit"]


def object_case(idx, nprops, ap_mode):
    names = rng.sample(NAMES, nprops)
    picks = {n: PRIMS[rng.randrange(len(PRIMS))] for n in names}
    required = [n for n in names if rng.random() < 0.5]
    s = {"type": "object", "properties": {n: picks[n][0] for n in names}, "required": required}
    if ap_mode == "false":
        s["additionalProperties"] = False
    elif ap_mode == "true":
        s["additionalProperties"] = True
    elif ap_mode == "schema":
        s["additionalProperties"] = {"type": "integer"}
    full = {n: picks[n][1][0] for n in names}
    minimal = {n: picks[n][1][-1] for n in names if n in required}
    valid = [full, minimal]
    invalid = [[full], "string"]
    n0 = names[0]
    invalid.append({**full, n0: picks[n0][2][0]})
    if required:
        invalid.append({n: v for n, v in full.items() if n != required[0]})
    if ap_mode == "false":
        invalid.append({**full, "zzz_extra": 1})
    if ap_mode == "true":
        valid.append({**full, "zzz_extra": [1, {"a": None}]})
    if ap_mode == "schema":
        valid.append({**full, "zzz_extra": 5})
        invalid.append({**full, "zzz_extra": "5"})
    add(f"object_{idx}_{nprops}_{ap_mode}", s, valid, invalid)


for i in range(40):
    object_case(i, 1 + i % 8, ["absent", "false", "true", "schema"][i % 4])

# 8. nested objects
for i in range(10):
    depth = 1 + i % 4
    inner = {"type": "object", "properties": {"leaf": {"type": "integer"}, "text": {"type": "string"}}, "required": ["leaf"]}
    inner_v = {"leaf": 1, "text": "t"}
    inner_bad = {"text": "t"}
    for d in range(depth):
        if (d + i) % 2:
            inner = {"type": "object", "properties": {"child": inner, "n": {"type": "number"}}, "required": ["child"]}
            inner_v = {"child": inner_v, "n": 1.5}
            inner_bad = {"child": inner_bad}
        else:
            inner = {"type": "array", "items": inner, "minItems": 1}
            inner_v = [inner_v, inner_v]
            inner_bad = [inner_bad]
    add(f"nested_{i}_{depth}", inner, [inner_v], [inner_bad])

# 9. anyOf, oneOf, allOf
for i in range(10):
    a, b = rng.sample(PRIMS, 2)
    s = {"anyOf": [a[0], b[0]]}
    bad = [x for x in a[2] + b[2] + [{"q": 1}] if not any(x == y for y in a[1] + b[1])]
    # keep invalid values that fail both branches (checked by the test's validator too)
    add(f"anyof_{i}", s, a[1][:1] + b[1][:1], [{"q": [1]}])
for i in range(8):
    kinds = ["circle", "square", "rect", "tri"][: 2 + i % 3]
    branches = []
    valid = []
    for k in kinds:
        branches.append({"type": "object", "properties": {"kind": {"const": k}, "size": {"type": "number"}},
                         "required": ["kind", "size"], "additionalProperties": False})
        valid.append({"kind": k, "size": 2})
    add(f"oneof_discriminated_{i}", {"oneOf": branches}, valid, [{"kind": "hex", "size": 1}, {"kind": kinds[0]}])
add("oneof_types", {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}, ["s", 1, None], [1.5, True])
add("oneof_required_keys", {"oneOf": [
    {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"], "additionalProperties": False},
    {"type": "object", "properties": {"phone": {"type": "string"}}, "required": ["phone"], "additionalProperties": False}]},
    [{"email": "a@b.c"}, {"phone": "123"}], [{}, {"email": "x", "phone": "y"}])
for i in range(8):
    parts = []
    valid = {}
    req = []
    for j in range(2 + i % 3):
        name = NAMES[(i * 3 + j) % len(NAMES)]
        p = PRIMS[(i + j) % len(PRIMS)]
        parts.append({"type": "object", "properties": {name: p[0]}, "required": [name]})
        valid[name] = p[1][0]
        req.append(name)
    add(f"allof_{i}", {"allOf": parts}, [valid], [{k: v for k, v in valid.items() if k != req[0]}])

# 10. $ref and $defs
add("ref_defs_simple", {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/$defs/pos"}},
    [[1, 2], []], [[0]])
add("ref_definitions", {"definitions": {"name": {"type": "string", "minLength": 1}},
                        "type": "object", "properties": {"first": {"$ref": "#/definitions/name"}, "last": {"$ref": "#/definitions/name"}},
                        "required": ["first"]}, [{"first": "A", "last": "B"}], [{"first": ""}])
add("ref_linked_list", {"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                                           "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                                           "required": ["value", "next"], "additionalProperties": False}},
                        "$ref": "#/$defs/node"},
    [{"value": 1, "next": None}, {"value": 1, "next": {"value": 2, "next": None}}], [{"value": 1}, {"value": "1", "next": None}])
add("ref_tree_root", {"type": "object", "properties": {"label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
                      "required": ["label"]},
    [{"label": "a", "children": [{"label": "b"}, {"label": "c", "children": []}]}], [{"children": []}, {"label": "a", "children": [1]}])
add("ref_mutual", {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}},
                             "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 2}}, "$ref": "#/$defs/a"},
    [{}, {"b": [{}, {"b": []}]}], [{"b": [{}, {}, {}]}])
add("ref_expression", {"$defs": {"expr": {"anyOf": [{"type": "number"}, {"type": "object", "properties": {
    "op": {"enum": ["+", "-", "*", "/"]}, "args": {"type": "array", "items": {"$ref": "#/$defs/expr"}, "minItems": 2, "maxItems": 2}},
    "required": ["op", "args"], "additionalProperties": False}]}}, "$ref": "#/$defs/expr"},
    [1, {"op": "+", "args": [1, {"op": "*", "args": [2, 3]}]}], [{"op": "%", "args": [1, 2]}, {"op": "+", "args": [1]}])
for i in range(6):
    p = PRIMS[i * 2]
    add(f"ref_prim_{i}", {"$defs": {"t": p[0]}, "type": "object", "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"$ref": "#/$defs/t"}},
                          "required": ["a", "b"]}, [{"a": p[1][0], "b": p[1][-1]}], [{"a": p[2][0], "b": p[1][0]}])

# 11. patterns
PATTERNS = [
    ("^[a-z]+$", ["abc"], ["ABC", ""]), ("^\\d{3}-\\d{4}$", ["555-1234"], ["5551234"]),
    ("^[A-Z]{2}\\d{2}[A-Z0-9]{4,30}$", ["GB82WEST12345698765432"], ["gb82"]),
    ("^(\\+\\d{1,3} )?\\d{3,14}$", ["+33 612345678", "5551234"], ["+33"]),
    ("^#[0-9a-fA-F]{6}$", ["#ff00AA"], ["#ff00a"]), ("^v\\d+\\.\\d+\\.\\d+(-[a-z0-9.]+)?$", ["v1.2.3", "v10.0.0-rc.1"], ["1.2.3"]),
    ("^[A-Za-z_][A-Za-z0-9_]*$", ["_var1"], ["1var"]), ("^(?:yes|no|maybe)$", ["maybe"], ["yess"]),
    ("^[^@\\s]+@[^@\\s]+\\.[a-z]{2,}$", ["a@b.co"], ["a@b", "a b@c.de"]), ("^\\w+(\\s\\w+)*$", ["two words"], ["two  spaces"]),
    ("^[0-9]{5}(-[0-9]{4})?$", ["12345", "12345-6789"], ["1234"]), ("^.{2,4}$", ["ab", "\u00e9\u00e9\u00e9"], ["a", "abcde"]),
    ("^[\\u0400-\\u04FF]+$", ["\u043f\u0440\u0438\u0432\u0435\u0442"], ["privet"]),
    ("^(ab|cd)+$", ["abcdab"], ["abc"]), ("^a?b*c+$", ["c", "abbc"], ["ab"]), ("^[^\"\\\\]*$", ["plain"], ["q\"uote"]),
    ("^\\S+$", ["nospace"], ["has space"]), ("^[a-c]{3}$", ["abc"], ["abd"]), ("^(\\d+|[a-f]+)$", ["123", "abc"], ["12a"]),
    ("[0-9]", ["abc1def", "9"], ["abc"]), ("^https?://", ["https://x.org/a", "http://"], ["ftp://x"]), ("\\.json$", ["a.json"], ["a.jsonx"]),
    ("^\\p?", None, None),
]
for i, (pat, valid, invalid) in enumerate(PATTERNS):
    if valid is None:
        continue
    add(f"pattern_{i}", {"type": "string", "pattern": pat}, valid, invalid + [1])

for i, (pat, lo, hi, valid, invalid) in enumerate([("^[a-z0-9_]+$", 3, 16, ["abc", "a_very_long_name"], ["ab", "Abc", "a" * 17]),
                                                   ("^\\d+$", None, 6, ["1", "123456"], ["1234567", ""]),
                                                   ("^[A-Z]{2}$", 2, 2, ["FR"], ["F"]), ("^.+$", 1, 10, ["x", "0123456789"], ["", "01234567890"])]):
    s = {"type": "string", "pattern": pat, "maxLength": hi}
    if lo is not None:
        s["minLength"] = lo
    add(f"pattern_length_{i}", s, valid, invalid)
add("required_beyond_properties", {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name", "id"],
                                   "additionalProperties": {"type": "integer"}}, [{"name": "a", "id": 1}, {"name": "a", "id": 2, "n": 3}],
    [{"name": "a"}, {"name": "a", "id": "1"}])
add("required_only", {"type": "object", "required": ["token"]}, [{"token": "x"}, {"token": [1, None]}], [{}])

# 12. formats
FORMATS = {"date": (["2024-02-29", "1999-12-31"], ["2023-02-29", "2024-1-1"]),
           "time": (["12:34:56Z", "23:59:59.999+01:00"], ["25:00:00Z"]),
           "date-time": (["2024-06-01T10:00:00Z", "2000-02-29T00:00:00-05:30"], ["2024-06-01"]),
           "uuid": (["6ba7b810-9dad-11d1-80b4-00c04fd430c8"], ["6ba7b810"]),
           "email": (["first.last@example.com", "x_y+z@sub.domain.org"], ["no-at-sign", "a@b"])}
for f, (valid, invalid) in FORMATS.items():
    add(f"format_{f}", {"type": "string", "format": f}, valid, invalid + [1])
    add(f"format_{f}_in_array", {"type": "array", "items": {"type": "string", "format": f}, "maxItems": 4}, [valid, []], [invalid])
    if f != "email":
        add(f"format_{f}_max_length", {"type": "string", "format": f, "maxLength": 40}, valid, invalid)

os.makedirs(OUT, exist_ok=True)
for old in os.listdir(OUT):
    if old.endswith(".json"):
        os.remove(os.path.join(OUT, old))
for name, doc in cases:
    with open(os.path.join(OUT, name.replace("-", "m").replace(" ", "_") + ".json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
print(len(cases), "schemas in", os.path.normpath(OUT))
