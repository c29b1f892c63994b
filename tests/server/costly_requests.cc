#include "tests/server/costly_requests.h"

#include <deque>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/request_bounds.h"
#include "tests/server/wire_bytes.h"

namespace knapformer::testing_util {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// A field number no request message uses.
constexpr int kUnknownNumber = 1000;

std::string Repeat(const std::string& piece, int times) {
  std::string out;
  out.reserve(piece.size() * times);
  for (int i = 0; i < times; ++i) out += piece;
  return out;
}

// `values` of `field` in its costliest form; "" for a singular scalar
// (sent again, it replaces itself: no cost).
std::string Costliest(const FieldDescriptor* field, int values, std::string* form) {
  const int number = field->number();
  switch (field->type()) {
    case FieldDescriptor::TYPE_MESSAGE:
      *form = "empty messages";
      return Repeat(Field(number, ""), values);
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
      *form = "empty strings";
      return Repeat(Field(number, ""), values);
    default:
      break;
  }
  if (!field->is_repeated()) return "";
  // A zero varint is one byte; fixed values take their width.
  const ValueForm value = ValueFormOf(field);
  const int64_t width = value.wire_type == kWireVarint ? 1 : value.widest_bytes;
  *form = "packed zeros";
  return Field(number, std::string(static_cast<size_t>(values) * width, '\0'));
}

}  // namespace

std::vector<CostlyRequest> CostlyRequests(int values) {
  std::vector<CostlyRequest> requests;
  for (const Descriptor* request : ScannedRequests()) {
    // Breadth first: each message type once, by the first path found.
    struct Place {
      const Descriptor* message;
      std::vector<const FieldDescriptor*> path;
    };
    std::deque<Place> todo = {{request, {}}};
    std::set<const Descriptor*> seen = {request};
    while (!todo.empty()) {
      Place place = std::move(todo.front());
      todo.pop_front();
      std::string at = request->name();
      for (const FieldDescriptor* step : place.path) absl::StrAppend(&at, ".", step->name());
      // Wraps `inner` (fields of place.message) into the request.
      auto wrap = [&](std::string inner) {
        for (auto it = place.path.rbegin(); it != place.path.rend(); ++it) {
          inner = Field((*it)->number(), inner);
        }
        return inner;
      };
      for (int i = 0; i < place.message->field_count(); ++i) {
        const FieldDescriptor* field = place.message->field(i);
        std::string form;
        std::string bytes = Costliest(field, values, &form);
        if (!bytes.empty()) {
          requests.push_back(CostlyRequest{
              request, absl::StrCat(at, ".", field->name(), ": ", form), wrap(std::move(bytes))});
        }
        if (field->type() == FieldDescriptor::TYPE_MESSAGE &&
            seen.insert(field->message_type()).second) {
          std::vector<const FieldDescriptor*> path = place.path;
          path.push_back(field);
          todo.push_back(Place{field->message_type(), std::move(path)});
        }
      }
      requests.push_back(CostlyRequest{request, absl::StrCat(at, ": unknown varint fields"),
                                       wrap(Repeat(Tag(kUnknownNumber, 0) + Varint(0), values))});
      requests.push_back(CostlyRequest{request, absl::StrCat(at, ": unknown empty fields"),
                                       wrap(Repeat(Field(kUnknownNumber, ""), values))});
    }
  }
  return requests;
}

}  // namespace knapformer::testing_util
