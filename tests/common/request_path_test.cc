#include "common/request_path.h"

#include <gtest/gtest.h>

#include <string>

namespace idemgate {
namespace {

std::string Normal(std::string_view path, bool merge_slashes = true) {
  std::string out;
  NormalizePath(path, merge_slashes, out);
  return out;
}

TEST(RequestPath, DecodesEncodedUnreservedCharactersInEitherCase) {
  EXPECT_EQ(Normal("/api/v1/%70ayments"), "/api/v1/payments");
  EXPECT_EQ(Normal("/%41%5a%61%7A%30%39%2D%2E%5F%7E"), "/AZaz09-._~");
  EXPECT_EQ(Normal("/%7e%7E"), "/~~");
  EXPECT_TRUE(PathNeedsNormalizing("/api/v1/%70ayments", false));
}

TEST(RequestPath, LeavesOtherEscapesAndBrokenOnesAsTheyAre) {
  // Reserved, control, space, non-ASCII and the escape of '%' itself keep
  // their meaning only while encoded; "%2570" must not become "%70" or "p".
  for (const char* kept : {"/a%2Fb", "/a%2fb", "/a%20b", "/a%00b", "/a%3Fb", "/a%25", "/a%2570", "/a%C3%A9",
                           "/a%", "/a%7", "/a%G0", "/a%0G", "/plain", "/", "/a/b/"}) {
    EXPECT_FALSE(PathNeedsNormalizing(kept, true)) << kept;
    EXPECT_EQ(Normal(kept), kept);
  }
}

// A decoded hex digit must not complete a '%' written before it into a new
// escape: "/api/v1/%%37%30ayments" would be routed as "/api/v1/%70ayments"
// (a catch-all) and reach the upstream as "/api/v1/payments", and "/a%2%46b"
// would become "/a%2Fb". Such escapes stay encoded, so the normal form is
// stable and means to the upstream what the path as sent meant.
TEST(RequestPath, DecodedDigitNeverCompletesAnEscape) {
  for (const char* kept : {"/a%2%46b", "/%4%31", "/%%34", "/%%%34"}) {
    EXPECT_FALSE(PathNeedsNormalizing(kept, true)) << kept;
    EXPECT_FALSE(PathNeedsNormalizing(kept, false)) << kept;
    EXPECT_EQ(Normal(kept), kept);
  }
  // Only the escape right after the '%' is kept; later ones are decoded.
  EXPECT_TRUE(PathNeedsNormalizing("/api/v1/%%37%30ayments", true));
  EXPECT_EQ(Normal("/api/v1/%%37%30ayments"), "/api/v1/%%370ayments");
  EXPECT_EQ(Normal("/api/v1/%%370ayments"), "/api/v1/%%370ayments");
  EXPECT_EQ(Normal("/a/%%32%45%%32%45"), "/a/%%32E%%32E");
  EXPECT_EQ(Normal("/%%34%31"), "/%%341");
  // A letter that is not a hex digit cannot complete an escape.
  EXPECT_EQ(Normal("/%%78%41"), "/%xA");
  // What was written before the call does not count.
  std::string out = "%";
  NormalizePath("%34", true, out);
  EXPECT_EQ(out, "%4");
}

TEST(RequestPath, MergesRunsOfSlashesOnlyWhenAsked) {
  EXPECT_EQ(Normal("//api///v1//payments//"), "/api/v1/payments/");
  EXPECT_TRUE(PathNeedsNormalizing("//api", true));
  EXPECT_TRUE(PathNeedsNormalizing("/api//", true));
  EXPECT_FALSE(PathNeedsNormalizing("//api///v1", false));
  EXPECT_EQ(Normal("//api///v1", false), "//api///v1");
  // A decoded character never joins a run of slashes: %2F stays encoded.
  EXPECT_EQ(Normal("/a/%2F/b"), "/a/%2F/b");
  EXPECT_EQ(Normal("/%7e//x"), "/~/x");
}

TEST(RequestPath, AppendsToWhatIsThere) {
  std::string out = "prefix/";
  NormalizePath("//a%62", true, out);
  EXPECT_EQ(out, "prefix//ab");
}

// Agrees with its own check: a path needs normalising exactly when the
// normalised form differs, for every short path over a confusable alphabet.
TEST(RequestPath, NeedsNormalizingIffTheFormChanges) {
  const std::string alphabet = "/%27aF~";
  std::string path(4, ' ');
  for (std::size_t n = 0; n < alphabet.size() * alphabet.size() * alphabet.size() * alphabet.size(); ++n) {
    std::size_t k = n;
    for (char& c : path) {
      c = alphabet[k % alphabet.size()];
      k /= alphabet.size();
    }
    for (const bool merge : {true, false}) {
      std::string out;
      NormalizePath(path, merge, out);
      EXPECT_EQ(PathNeedsNormalizing(path, merge), out != path) << path << " merge=" << merge;
    }
  }
}

}  // namespace
}  // namespace idemgate
