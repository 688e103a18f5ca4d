#include "webhooks/internal.h"

#include <string>

namespace idemgate::webhooks::internal {

// ---------------------------------------------------------------------------
// Generic: `prefix` + hex or base64 HMAC of the body in a configured header;
// the id from a header, a JSON Pointer or form fields.

namespace {

Translation GenericId(const GenericSpec& spec, const WebhookRequest& request) {
  const int sources = !spec.id_header.empty() + !spec.id_pointer.empty() + !spec.id_form_fields.empty();
  if (sources != 1) return NoId("generic provider needs exactly one id source");

  std::string problem;
  if (!spec.id_header.empty()) {
    const auto id = IdHeader(request, spec.id_header, &problem);
    if (!id) return NoId(problem);
    return Ok(std::string(*id));
  }

  if (!spec.id_pointer.empty()) {
    const auto body = ParseJson(request.body);
    if (!body) return NoId("body is not JSON");
    boost::system::error_code ec;  // an invalid or absent pointer finds nothing
    const json::value* id = body->find_pointer(spec.id_pointer, ec);
    if (id != nullptr && id->is_string() && !id->get_string().empty()) return Ok(std::string(id->get_string()));
    if (id != nullptr && id->is_int64()) return Ok(std::to_string(id->get_int64()));
    if (id != nullptr && id->is_uint64()) return Ok(std::to_string(id->get_uint64()));
    return NoId("the id pointer names no string or integer");
  }

  const auto form = FormBody(request);
  if (!form) return NoId("body is not a form");
  // Several fields are joined with '-', each escaped (AppendKeyPart) so that
  // no two lists of values make the same key. One field is taken as it is.
  const bool joined = spec.id_form_fields.size() > 1;
  std::string key;
  for (const std::string& name : spec.id_form_fields) {
    const Lookup field = FindField(*form, name);
    if (field.count > 1) return NoId("id field " + name + " appears more than once");
    if (field.value.empty()) return NoId("missing id field " + name);
    if (!key.empty()) key.push_back('-');
    if (joined) {
      AppendKeyPart(key, field.value);
    } else {
      key.append(field.value);
    }
  }
  return Ok(std::move(key));
}

}  // namespace

Translation VerifyGeneric(const GenericSpec* spec, std::string_view secret, const WebhookRequest& request) {
  if (spec == nullptr) return Invalid("generic provider without settings");
  std::string problem;
  const auto header = SignatureHeader(request, spec->header, &problem);
  if (!header) return Invalid(problem);
  if (header->substr(0, spec->prefix.size()) != spec->prefix) {
    return Invalid(spec->header + " does not start with its prefix");
  }
  const std::string_view text = header->substr(spec->prefix.size());
  const auto sent = spec->encoding == Encoding::kHex ? DecodeHex(text) : DecodeBase64(text);
  if (!sent || sent->size() != MacSize(spec->algorithm)) return Invalid(spec->header + " is not an HMAC");
  if (!MacEquals(Hmac(spec->algorithm, secret, request.body), *sent)) return Invalid(spec->header + " does not match");
  return GenericId(*spec, request);
}

}  // namespace idemgate::webhooks::internal
