/**
 * Small loopback HTTP servers of the tests (a webhook receiver, a server
 * that answers 503 or a captive portal's page): started on a free port,
 * closed with their keep-alive connections.
 */

import type { Server } from "node:http";

/** Listens on a free loopback port; the server's base URL. */
export async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

/** Closes the server and its connections (Node 18 leaves idle keep-alive ones open otherwise). */
export async function close(server: Server): Promise<void> {
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeAllConnections();
  await closed;
}
