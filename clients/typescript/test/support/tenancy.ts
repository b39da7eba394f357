/**
 * Provisioning for tests through the admin API: one enterprise `acme` with
 * subsystem `sales`, the databases and devices asked for, each with its
 * own client.
 */

import { EstafetaClient } from "../../src/index.js";
import { ADMIN_TOKEN, type TestServer } from "./server.js";

/** A database or device and its client. */
export interface Party {
  id: string;
  token: string;
  client: EstafetaClient;
}

/** What {@link provision} made. */
export interface Tenancy {
  admin: EstafetaClient;
  databases: Party[];
  devices: Party[];
}

/** Makes `acme`, `sales`, the databases and the devices on `server`. */
export async function provision(
  server: TestServer,
  databases: string[] = ["db-a"],
  devices: string[] = ["phone-1"],
): Promise<Tenancy> {
  const admin = server.admin();
  await admin.createEnterprise("acme");
  await admin.createSubsystem("acme", "sales");
  const party = (id: string, token: string): Party => ({ id, token, client: admin.withToken(token) });
  const dbs: Party[] = [];
  for (const id of databases) dbs.push(party(id, (await admin.createDatabase("acme", id)).token));
  const devs: Party[] = [];
  for (const id of devices) devs.push(party(id, (await admin.createDevice("acme", id, "sales")).token));
  return { admin, databases: dbs, devices: devs };
}

export { ADMIN_TOKEN };
