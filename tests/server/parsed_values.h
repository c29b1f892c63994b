#ifndef KNAPFORMER_TESTS_SERVER_PARSED_VALUES_H_
#define KNAPFORMER_TESTS_SERVER_PARSED_VALUES_H_

// The values of every repeated field of a parsed message and of the messages
// it holds, read by reflection: the oracle the wire scan's counts
// (server/request_scan.h) are held to.

#include <cstdint>
#include <map>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace knapformer::testing_util {

inline void AddParsedValues(const google::protobuf::Message& message,
                            std::map<const google::protobuf::FieldDescriptor*, int64_t>* values) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->is_repeated()) (*values)[field] += reflection->FieldSize(message, field);
    if (field->type() != FieldDescriptor::TYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        AddParsedValues(reflection->GetRepeatedMessage(message, field, i), values);
      }
    } else {
      AddParsedValues(reflection->GetMessage(message, field), values);
    }
  }
}

inline std::map<const google::protobuf::FieldDescriptor*, int64_t> ParsedValues(
    const google::protobuf::Message& message) {
  std::map<const google::protobuf::FieldDescriptor*, int64_t> values;
  AddParsedValues(message, &values);
  return values;
}

}  // namespace knapformer::testing_util

#endif  // KNAPFORMER_TESTS_SERVER_PARSED_VALUES_H_
