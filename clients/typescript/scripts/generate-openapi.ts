/**
 * `npm run generate`: starts the server binary the tests use
 * (`ESTAFETA_BIN`), reads its OpenAPI document and writes the TypeScript
 * types of it to `src/generated/openapi.ts`.
 */

import { writeFile } from "node:fs/promises";
import { TestServer } from "../test/support/server.js";
import { GENERATED_PATH, renderTypes } from "./openapi-types.js";

const server = await TestServer.start();
try {
  const document = await server.admin().openapi();
  await writeFile(GENERATED_PATH, await renderTypes(document));
  console.log(`wrote ${GENERATED_PATH}`);
} finally {
  await server.stop();
}
