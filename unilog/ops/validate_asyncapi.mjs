#!/usr/bin/env node
// Validate an AsyncAPI document (JSON or YAML) with the official parser, @asyncapi/parser v3 (npm). Shipped in the
// wheel (package data of unilog.ops) and run by `unilog asyncapi --validate [FILE]` (unilog/ops/asyncapi_validate.py),
// which finds node, installs the parser once into its cache folder and passes it as ASYNCAPI_PARSER_DIR:
//
//   node validate_asyncapi.mjs FILE [NAME]     # NAME: how to call the document in the verdict (default FILE)
//
// Prints every diagnostic (severity, code, path, message) and exits 1 if any is an error (2: no such file or no
// parser), 0 otherwise.
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const SEVERITY = ["error", "warning", "info", "hint"];

async function loadParser() {
  const dir = process.env.ASYNCAPI_PARSER_DIR;
  if (dir) {
    const require = createRequire(path.join(path.resolve(dir), "package.json"));
    return import(pathToFileURL(require.resolve("@asyncapi/parser")).href);
  }
  return import("@asyncapi/parser");
}

async function main(file, name = file) {
  if (!file) {
    console.error("usage: validate_asyncapi.mjs FILE [NAME]");
    return 2;
  }
  let parserModule, text;
  try {
    parserModule = await loadParser();
  } catch (e) {
    const first = String(e.message).split("\n")[0];
    console.error(`cannot load @asyncapi/parser (npm install @asyncapi/parser@3, or set ASYNCAPI_PARSER_DIR): ${first}`);
    return 2;
  }
  try {
    text = await readFile(file, "utf8");
  } catch (e) {
    console.error(`cannot read ${name}: ${e.message}`);
    return 2;
  }
  const Parser = parserModule.Parser ?? parserModule.default?.Parser;
  const parser = new Parser();
  const { document, diagnostics } = await parser.parse(text, { source: path.resolve(file) });
  let errors = 0;
  for (const d of diagnostics) {
    if (d.severity === 0) errors += 1;
    const where = (d.path || []).join("/") || "(document)";
    console.log(`${SEVERITY[d.severity] ?? d.severity} ${d.code} at ${where}: ${d.message}`);
  }
  if (errors || !document) {
    console.log(`${name}: invalid (${errors} error${errors === 1 ? "" : "s"})`);
    return 1;
  }
  console.log(`${name}: valid AsyncAPI ${document.version()}`);
  return 0;
}

process.exitCode = await main(process.argv[2], process.argv[3]);
