#!/usr/bin/env node
// The AsyncAPI validator now ships inside the package (unilog/ops/validate_asyncapi.mjs); this runs that one.
// Prefer `unilog asyncapi --validate FILE`: it finds node and installs @asyncapi/parser itself. Run directly,
//
//   ASYNCAPI_PARSER_DIR=<folder with @asyncapi/parser@3 installed> node tools/validate_asyncapi.mjs FILE
import "../unilog/ops/validate_asyncapi.mjs";
