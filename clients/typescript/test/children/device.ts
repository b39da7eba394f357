/**
 * A device app as a child process, for the crash tests: an outbox on disk
 * (`--dir`) that optionally queues `--enqueue N` messages with nonces
 * `<prefix>-<i>`, then drains; `--pace-ms` spaces its uploads (a slow
 * network), and `--lose-answer-after K` makes it stop for good right after
 * the K-th upload's answer arrived and before the outbox sees it (the app
 * killed at the worst moment). It reports on stdout: `recovered N`,
 * `queued <nonce>`, `queued-all`, `answer <status>`, `sent <nonce> <id>`,
 * `answer-lost`, `drained`.
 */

import { setTimeout as delay } from "node:timers/promises";
import { EstafetaClient, Outbox, type FetchLike } from "../../src/index.js";
import { FileOutboxStore } from "../../src/node/index.js";
import { arg, hangUntilKilled } from "./args.js";

const say = (line: string): void => void process.stdout.write(`${line}\n`);

const enqueue = Number(arg("enqueue", "0"));
const prefix = arg("prefix", "m");
const paceMs = Number(arg("pace-ms", "0"));
const loseAfter = Number(arg("lose-answer-after", "0"));
let uploads = 0;

const observed: FetchLike = async (url, request) => {
  const upload = url.endsWith("/v1/messages");
  if (upload && paceMs > 0) await delay(paceMs);
  const response = await fetch(url, request as RequestInit);
  if (!upload) return response;
  const text = await response.text();
  say(`answer ${response.status}`);
  if (++uploads === loseAfter) {
    say("answer-lost");
    await hangUntilKilled();
  }
  return new Response(text, { status: response.status, headers: response.headers });
};

const outbox = await Outbox.open({
  client: new EstafetaClient({ baseUrl: arg("url"), token: arg("token"), timeoutMs: 5000, fetch: observed }),
  store: await FileOutboxStore.open(arg("dir")),
  backoff: { initialMs: 50, maxMs: 500 },
  onChange: (entry) => {
    if (entry.state === "sent") say(`sent ${(entry.body as { nonce: string }).nonce} ${entry.messageId}`);
    if (entry.state === "failed") say(`failed ${(entry.body as { nonce: string }).nonce} ${entry.failure?.message}`);
  },
});
say(`recovered ${outbox.recovered}`);
for (let i = 0; i < enqueue; i++) {
  const nonce = `${prefix}-${i}`;
  await outbox.send(arg("to"), { nonce });
  say(`queued ${nonce}`);
}
if (enqueue > 0) say("queued-all");
await outbox.drain();
say("drained");
