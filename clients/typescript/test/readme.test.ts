/** The README's example is the file the live tests run, character for character. */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE } from "./vectors.js";

test("the README's example is test/integration/readme-example.ts", () => {
  const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
  const section = readme.indexOf("\n## Example\n");
  assert.ok(section >= 0, "the README has an Example section");
  const start = readme.indexOf("```ts\n", section);
  const end = readme.indexOf("\n```\n", start);
  assert.ok(start >= 0 && end > start, "the Example section has a ts block");
  const block = readme.slice(start + "```ts\n".length, end + 1);
  const example = readFileSync(join(PACKAGE, "test/integration/readme-example.ts"), "utf8");
  assert.equal(block, example);
  assert.ok(block.split("\n").length - 1 <= 20, "at most 20 lines");
});
