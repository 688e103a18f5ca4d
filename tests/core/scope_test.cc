#include "core/scope.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace idemgate::core {
namespace {

const Caller kAlice{"acme", "shop", "user:alice"};

TEST(ScopeTest, SubjectScopeKeepsEverything) {
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, kAlice, "payments", "k1"),
            "t-acme:shop:user:alice:payments:k1");
}

TEST(ScopeTest, ProjectScopeDropsSubject) {
  EXPECT_EQ(ScopedKey(ScopeLevel::kProject, kAlice, "payments", "k1"), "t-acme:shop:_:payments:k1");
}

TEST(ScopeTest, TenantScopeDropsProjectAndSubject) {
  EXPECT_EQ(ScopedKey(ScopeLevel::kTenant, kAlice, "payments", "k1"), "t-acme:_:_:payments:k1");
}

TEST(ScopeTest, GlobalScopeDropsAllThree) {
  EXPECT_EQ(ScopedKey(ScopeLevel::kGlobal, kAlice, "payments", "k1"), "t-_:_:_:payments:k1");
}

TEST(ScopeTest, EmptyComponentsBecomeUnderscore) {
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, Caller{}, "r", "k"), "t-_:_:_:r:k");
}

TEST(ScopeTest, TenantAndPlatformProjects) {
  EXPECT_EQ(kTenantProject, "_tenant");
  EXPECT_EQ(kPlatformProject, "_platform");
  const Caller tenant_level{"acme", std::string(kTenantProject), "service:billing"};
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, tenant_level, "invoices", "k"),
            "t-acme:_tenant:service:billing:invoices:k");
}

TEST(ScopeTest, DifferentCallersNeverShareAKey) {
  const Caller others[] = {
      {"acme", "shop", "user:bob"},
      {"acme", "other", "user:alice"},
      {"evil", "shop", "user:alice"},
  };
  const std::string mine = ScopedKey(ScopeLevel::kSubject, kAlice, "payments", "k1");
  for (const Caller& c : others) {
    EXPECT_NE(ScopedKey(ScopeLevel::kSubject, c, "payments", "k1"), mine);
  }
  EXPECT_NE(ScopedKey(ScopeLevel::kSubject, kAlice, "refunds", "k1"), mine);
}

TEST(ScopeTest, ColonsInComponentsCannotForgeAnotherScope) {
  // Without escaping, tenant "a:b" / project "c" and tenant "a" / project
  // "b:c" would both read "t-a:b:c:...".
  std::set<std::string> keys;
  keys.insert(ScopedKey(ScopeLevel::kSubject, {"a:b", "c", "s"}, "r", "k"));
  keys.insert(ScopedKey(ScopeLevel::kSubject, {"a", "b:c", "s"}, "r", "k"));
  keys.insert(ScopedKey(ScopeLevel::kSubject, {"a", "b", "c:s"}, "r", "k"));
  keys.insert(ScopedKey(ScopeLevel::kSubject, {"a", "b", "c"}, "s:r", "k"));
  keys.insert(ScopedKey(ScopeLevel::kSubject, {"a", "b", "c:s:r"}, "r", "k"));
  keys.insert(ScopedKey(ScopeLevel::kSubject, {"a%3Ab", "c", "s"}, "r", "k"));
  EXPECT_EQ(keys.size(), 6u);
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, {"a:b", "c%", "s"}, "r", "k"), "t-a%3Ab:c%25:s:r:k");
}

// "_" stands for a component left out of the scope: a caller whose tenant,
// project or subject is "_" must not read, at a narrower scope, the keys of
// every caller at a wider one (or after a route's scope changed).
TEST(ScopeTest, AComponentWhoseValueIsAnUnderscoreIsNotAComponentLeftOut) {
  const Caller underscores[] = {{"t1", "p1", "_"}, {"t1", "_", "alice"}, {"_", "p1", "alice"}, {"_", "_", "_"}};
  const Caller wider[] = {{"t1", "p1", "alice"}, {"t1", "p2", "bob"}, {"t2", "p1", "carol"}, {}};
  std::set<std::string> keys;
  std::size_t made = 0;
  for (const Caller& c : underscores) {
    keys.insert(ScopedKey(ScopeLevel::kSubject, c, "r", "k"));
    ++made;
  }
  for (const Caller& c : wider) {
    for (const ScopeLevel level : {ScopeLevel::kProject, ScopeLevel::kTenant, ScopeLevel::kGlobal}) {
      const std::string key = ScopedKey(level, c, "r", "k");
      EXPECT_FALSE(keys.contains(key)) << key;
    }
  }
  EXPECT_EQ(keys.size(), made);
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, {"t1", "p1", "_"}, "r", "k"), "t-t1:p1:%5F:r:k");
  EXPECT_EQ(ScopedKey(ScopeLevel::kProject, {"t1", "_", "x"}, "r", "k"), "t-t1:%5F:_:r:k");
  // A subject starting with '%' gets one more, so none reads as "%5F".
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, {"t1", "p1", "%5F"}, "r", "k"), "t-t1:p1:%%5F:r:k");
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, {"t1", "p1", "%%5F"}, "r", "k"), "t-t1:p1:%%%5F:r:k");
  EXPECT_EQ(ScopedKey(ScopeLevel::kSubject, {"t1", "p1", "a%"}, "r", "k"), "t-t1:p1:a%:r:k");
}

}  // namespace
}  // namespace idemgate::core
