/** A loopback URL nobody listens on: every request to it is refused. */

import { createServer } from "node:net";

/** `http://127.0.0.1:<a port that was just free and is closed again>`. */
export async function refusedUrl(): Promise<string> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const port = (probe.address() as { port: number }).port;
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}
