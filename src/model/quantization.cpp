#include "model/quantization.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ptllm {

using nlohmann::json;

bool affine_supported(const AffineSpec& s) {
  return std::find(std::begin(kAffineBits), std::end(kAffineBits), s.bits) != std::end(kAffineBits) &&
         std::find(std::begin(kAffineGroupSizes), std::end(kAffineGroupSizes), s.group_size) !=
             std::end(kAffineGroupSizes);
}

const std::optional<AffineSpec>* QuantizationConfig::override_for(const std::string& module) const {
  auto it = overrides.find(module);
  return it == overrides.end() ? nullptr : &it->second;
}

std::optional<AffineSpec> QuantizationConfig::for_module(const std::string& module) const {
  if (const auto* o = override_for(module)) return *o;
  return base;
}

json QuantizationConfig::to_json() const {
  if (!base) return nullptr;
  json j = {{"group_size", base->group_size}, {"bits", base->bits}};
  for (const auto& [module, spec] : overrides)
    j[module] = spec ? json{{"group_size", spec->group_size}, {"bits", spec->bits}} : json(false);
  return j;
}

namespace {

std::string supported_list() {
  std::string s = "bits ";
  for (int b : kAffineBits) s += std::to_string(b) + (b == kAffineBits[std::size(kAffineBits) - 1] ? "" : ", ");
  s += "; group_size ";
  for (int g : kAffineGroupSizes)
    s += std::to_string(g) + (g == kAffineGroupSizes[std::size(kAffineGroupSizes) - 1] ? "" : ", ");
  return s;
}

// {"group_size", "bits"[, "mode": "affine"]}; a field missing from an override is the default's.
AffineSpec parse_spec(const json& o, const std::optional<AffineSpec>& inherit, const std::string& file,
                      const std::string& where) {
  auto bad = [&](const std::string& field, const std::string& what) -> Error {
    return Error(file + ": field '" + where + (field.empty() ? "" : "." + field) + "' " + what);
  };
  AffineSpec s = inherit.value_or(AffineSpec{});
  for (const char* field : {"group_size", "bits"}) {
    int& dst = std::string(field) == "bits" ? s.bits : s.group_size;
    if (!o.contains(field)) {
      if (!inherit) throw bad(field, "is missing");
      continue;
    }
    const json& v = o[field];
    if (!v.is_number_integer() || v.get<long long>() <= 0 || v.get<long long>() > 1024)
      throw bad(field, "must be a positive integer, got " + v.dump());
    dst = v.get<int>();
  }
  if (o.contains("mode") && o["mode"] != "affine")
    throw bad("mode", o["mode"].dump() + " is not supported (supported: \"affine\", MLX's default)");
  if (!affine_supported(s))
    throw bad("", "asks for " + std::to_string(s.bits) + "-bit codes in groups of " + std::to_string(s.group_size) +
                      ", which this runtime does not read (supported: " + supported_list() + ")");
  return s;
}

}  // namespace

QuantizationConfig QuantizationConfig::from_json(const json& q, const std::string& file, const std::string& key) {
  if (!q.is_object())
    throw Error(file + ": field '" + key + "' must be an object ({\"group_size\": 64, \"bits\": 4}), got " + q.dump());
  if (q.contains("quant_method") && q["quant_method"] != "mlx")
    throw Error(file + ": field '" + key + ".quant_method' " + q["quant_method"].dump() +
                " is not supported (supported: the MLX affine layout, weight codes + scales + biases)");
  QuantizationConfig c;
  c.base = parse_spec(q, std::nullopt, file, key);
  for (const auto& item : q.items()) {
    const std::string& name = item.key();
    const json& v = item.value();
    if (name == "group_size" || name == "bits" || name == "mode" || name == "quant_method") continue;
    // Anything else names a module: its own spec, false (left dense) or true (the default).
    const std::string where = key + "." + name;
    if (v.is_object())
      c.overrides[name] = parse_spec(v, c.base, file, where);
    else if (v.is_boolean())
      c.overrides[name] = v.get<bool>() ? c.base : std::nullopt;
    else
      throw Error(file + ": field '" + where + "' must be {\"group_size\", \"bits\"} or false (a module path's own " +
                  "quantization), got " + v.dump());
  }
  return c;
}

}  // namespace ptllm
