#include "gateway/admin_handler.h"

#include "http/problem.h"

namespace idemgate::gateway {

namespace {
// Admin requests carry no meaningful body; anything larger is refused.
constexpr std::uint64_t kAdminBodyLimit = 64 * 1024;
}  // namespace

http::Task<void> AdminHandler::Handle(http::Exchange& exchange) {
  const http::RequestHead& head = exchange.head();
  if (!exchange.SetBodyLimit(kAdminBodyLimit) || (head.has_body() && co_await exchange.ReadBody() != http::BodyStatus::kOk)) {
    co_await exchange.Respond(http::MakeProblem(http::ProblemCode::kRequestTooLarge, "admin requests carry no body"));
    co_return;
  }
  admin::AdminRequest request;
  request.method = std::string(head.method);
  request.target = std::string(head.path_and_query);
  request.headers.reserve(head.headers.size());
  for (const http::HeaderView& h : head.headers) request.headers.push_back({std::string(h.name), std::string(h.value)});
  admin::AdminResponse answer = co_await api_.Handle(std::move(request));
  http::Response response;
  response.status = answer.status;
  if (!answer.content_type.empty()) response.headers.push_back({"Content-Type", std::move(answer.content_type)});
  for (auto& h : answer.headers) response.headers.push_back(std::move(h));
  response.body = std::move(answer.body);
  co_await exchange.Respond(std::move(response));
}

void AdminHandler::ConnectionRefused() {
  if (metrics_ != nullptr) metrics_->ConnectionRefused(admin::GatewayMetrics::Listener::kAdmin);
}

void AdminHandler::TlsHandshakeFailed() {
  if (metrics_ != nullptr) metrics_->TlsHandshakeFailed(admin::GatewayMetrics::Listener::kAdmin);
}

}  // namespace idemgate::gateway
