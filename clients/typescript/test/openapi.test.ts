/**
 * The checked-in types (`src/generated/openapi.ts`) are those of the
 * OpenAPI document a freshly started server serves: a change of the
 * server's API that the types do not follow fails here, with the command
 * that regenerates them.
 */

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { GENERATED_PATH, renderTypes } from "../scripts/openapi-types.js";
import { TestServer } from "./support/server.js";

test("the checked-in types are the server's /v1/openapi.json", { timeout: 60_000 }, async () => {
  const server = await TestServer.start();
  let document: unknown;
  try {
    document = await server.admin().withToken("").openapi();
  } finally {
    await server.stop();
  }
  const fresh = await renderTypes(document);
  const checkedIn = await readFile(fileURLToPath(new URL(`../../${GENERATED_PATH}`, import.meta.url)), "utf8");
  if (fresh !== checkedIn) {
    const a = checkedIn.split("\n");
    const b = fresh.split("\n");
    let line = 0;
    while (line < a.length && a[line] === b[line]) line++;
    assert.fail(
      `${GENERATED_PATH} differs from the server's OpenAPI document from line ${line + 1}:\n` +
        `  checked in: ${a[line] ?? "(end)"}\n  server:     ${b[line] ?? "(end)"}\n` +
        "run `npm run generate` (with ESTAFETA_BIN set to the server binary) and commit the result",
    );
  }
});
