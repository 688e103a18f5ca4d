#include "common/units.h"

#include <gtest/gtest.h>

namespace idemgate {
namespace {

TEST(ParseDuration, AcceptsEveryUnit) {
  EXPECT_EQ(ParseDuration("250ms").value(), Duration(250));
  EXPECT_EQ(ParseDuration("30s").value(), Duration(30'000));
  EXPECT_EQ(ParseDuration("5m").value(), Duration(300'000));
  EXPECT_EQ(ParseDuration("24h").value(), Duration(86'400'000));
  EXPECT_EQ(ParseDuration("7d").value(), Duration(604'800'000));
  EXPECT_EQ(ParseDuration("0").value(), Duration(0));
  EXPECT_EQ(ParseDuration("0s").value(), Duration(0));
}

TEST(ParseDuration, RejectsMalformed) {
  for (const char* bad : {"", "s", "10", "-1s", "1.5s", "10 s", "10sec", "10S", "99999999999999999999d",
                          "9999999999999999d"}) {
    auto d = ParseDuration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

// A fraction or a combined form is named as such, not as an unknown unit.
TEST(ParseDuration, SaysWhyAFractionOrACombinedFormIsRefused) {
  for (const char* bad : {"1.5s", "1h30m", "2m30s"}) {
    EXPECT_NE(ParseDuration(bad).status().message().find("no fractions, no combined units"), std::string::npos)
        << bad << ": " << ParseDuration(bad).status().message();
  }
  EXPECT_NE(ParseDuration("10sec").status().message().find("unit must be one of"), std::string::npos);
  EXPECT_NE(ParseSize("1.5MiB").status().message().find("no fractions"), std::string::npos)
      << ParseSize("1.5MiB").status().message();
}

TEST(ParseSize, AcceptsEveryUnit) {
  EXPECT_EQ(ParseSize("512").value(), 512u);
  EXPECT_EQ(ParseSize("64B").value(), 64u);
  EXPECT_EQ(ParseSize("16KiB").value(), 16u * 1024);
  EXPECT_EQ(ParseSize("10MiB").value(), 10u * 1024 * 1024);
  EXPECT_EQ(ParseSize("1GiB").value(), 1024ull * 1024 * 1024);
  EXPECT_EQ(ParseSize("2KB").value(), 2000u);
  EXPECT_EQ(ParseSize("3MB").value(), 3'000'000u);
  EXPECT_EQ(ParseSize("1GB").value(), 1'000'000'000u);
}

TEST(ParseSize, RejectsMalformed) {
  for (const char* bad : {"", "MiB", "-1MiB", "1.5MiB", "1 MiB", "1mib", "1TiB", "99999999999GiB"}) {
    EXPECT_FALSE(ParseSize(bad).ok()) << bad;
  }
}

TEST(Format, RoundTrips) {
  EXPECT_EQ(FormatDuration(Duration(90'000)), "90s");
  EXPECT_EQ(FormatDuration(Duration(0)), "0s");
  EXPECT_EQ(FormatDuration(Duration(86'400'000)), "1d");
  EXPECT_EQ(FormatDuration(Duration(1500)), "1500ms");
  EXPECT_EQ(FormatSize(1 << 20), "1MiB");
  EXPECT_EQ(FormatSize(1000), "1000B");
  for (const char* s : {"250ms", "30s", "5m", "7d"}) {
    EXPECT_EQ(FormatDuration(ParseDuration(s).value()), s);
  }
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = UnavailableError("redis down");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "UNAVAILABLE: redis down");
  StatusOr<int> v = 3;
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
  StatusOr<int> e = NotFoundError("x");
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace idemgate
