// The KV settings' one text form: describe() parses back to the same settings, for every precision,
// StreamingLLM and position scheme; parse errors name the token.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/config.h"

namespace ptllm {
namespace {

bool same_stored(const KVCacheConfig& a, const KVCacheConfig& b) {
  return a.precision == b.precision && a.sink == b.sink && a.window == b.window && a.positions == b.positions &&
         (!is_kivi(a.precision) || (a.group_size == b.group_size && a.residual == b.residual));
}

TEST(KVConfigText, DescribeParsesBack) {
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::F16, KVPrecision::BF16, KVPrecision::Int8, KVPrecision::Int4,
                        KVPrecision::Int2})
    for (int window : {0, 508})
      for (PositionMode pos : {PositionMode::Absolute, PositionMode::Cache}) {
        KVCacheConfig c;
        c.precision = p;
        c.group_size = 64;
        c.residual = 0;
        c.sink = window ? 4 : 0;
        c.window = window;
        c.positions = pos;
        const KVCacheConfig back = parse_kv_config(c.describe(), KVCacheConfig{});
        EXPECT_TRUE(same_stored(c, back)) << c.describe() << " -> " << back.describe();
        EXPECT_EQ(back.describe(), c.describe());
      }
}

TEST(KVConfigText, ErrorsNameTheToken) {
  auto message = [](const char* text) {
    try {
      parse_kv_config(text, KVCacheConfig{});
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("int4 q7").find("unknown token 'q7'"), std::string::npos);
  EXPECT_NE(message("int4 int8").find("'int8' sets the precision already set by 'int4'"), std::string::npos);
  EXPECT_NE(message("pos=sideways").find("bad value in 'pos=sideways'"), std::string::npos);
  EXPECT_NE(message("g99999999999").find("too large"), std::string::npos);
  // On top of a base: only what the text names changes; pos= defaults to the window's scheme.
  KVCacheConfig base;
  base.precision = KVPrecision::Int8;
  base.residual = 64;
  const KVCacheConfig c = parse_kv_config("sink4 w100", base);
  EXPECT_EQ(c.precision, KVPrecision::Int8);
  EXPECT_EQ(c.residual, 64);
  EXPECT_EQ(c.positions, PositionMode::Cache);
}

}  // namespace
}  // namespace ptllm
