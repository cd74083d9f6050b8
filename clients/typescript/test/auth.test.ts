// TLS and authentication: a throwaway CA and server certificate made with openssl, a
// principals file with a bearer token (`eventbus auth new-token` when the CLI is built),
// and a client certificate for mutual TLS.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { Client, Unauthenticated, Unavailable, Worker, type Event } from "@socle/eventbus";

import { Daemon, REPO, take, tempDir, uniqueName } from "./helpers.js";

const T = { timeout: 60_000 };

function openssl(dir: string, ...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/** A CA, a server certificate for 127.0.0.1/localhost and a client certificate (CN=admin). */
function makeCerts(dir: string): void {
  openssl(dir, "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-sha256",
    "-days", "2", "-subj", "/CN=eventbus test CA", "-addext", "basicConstraints=critical,CA:TRUE",
    "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.crt");
  const leaf = (name: string, cn: string, eku: string, san: string): void => {
    writeFileSync(join(dir, `${name}.ext`),
      `basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=${eku}\nsubjectAltName=${san}\n`);
    openssl(dir, "req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-subj", `/CN=${cn}`,
      "-keyout", `${name}.sec1.key`, "-out", `${name}.csr`);
    openssl(dir, "pkcs8", "-topk8", "-nocrypt", "-in", `${name}.sec1.key`, "-out", `${name}.key`);
    openssl(dir, "x509", "-req", "-in", `${name}.csr`, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
      "-days", "2", "-sha256", "-extfile", `${name}.ext`, "-out", `${name}.crt`);
  };
  leaf("server", "eventbusd", "serverAuth", "DNS:localhost,IP:127.0.0.1");
  leaf("client", "admin", "clientAuth", "DNS:admin");
}

/** A token and its SHA-256, from `eventbus auth new-token` when the CLI is built. */
function newToken(name: string): { token: string; sha256: string } {
  const cli = process.env.EVENTBUS_CLI ?? join(REPO, "target", "debug", "eventbus");
  if (existsSync(cli)) {
    const out = execFileSync(cli, ["auth", "new-token", name], { encoding: "utf8" });
    const token = out.split("\n")[0]!.trim();
    const sha256 = /token_sha256: ([0-9a-f]{64})/.exec(out)![1]!;
    return { token, sha256 };
  }
  const token = `ebt_${randomBytes(32).toString("hex")}`;
  return { token, sha256: createHash("sha256").update(token).digest("hex") };
}

const RIGHTS = `    permissions:
      publish: { allow: [">"] }
      subscribe: { allow: [">"] }
      consumers: { allow: ["*"] }
      manage_consumers: ["*"]
`;

describe("TLS and a bearer token", () => {
  let dir: string;
  let daemon: Daemon;
  let mtls: Daemon;
  let token: string;

  before(async () => {
    dir = tempDir("auth");
    makeCerts(dir);
    const issued = newToken("tester");
    token = issued.token;
    assert.equal(createHash("sha256").update(token).digest("hex"), issued.sha256);
    const principals = join(dir, "principals.yaml");
    writeFileSync(
      principals,
      `principals:\n  - name: tester\n    token_sha256: ${issued.sha256}\n${RIGHTS}  - name: admin\n    cert_subject: admin\n${RIGHTS}`,
    );
    const env = {
      EVENTBUS__SERVER__TLS__CERT_FILE: join(dir, "server.crt"),
      EVENTBUS__SERVER__TLS__KEY_FILE: join(dir, "server.key"),
      EVENTBUS__AUTH__ENABLED: "true",
      EVENTBUS__AUTH__PRINCIPALS_FILE: principals,
    };
    daemon = await Daemon.start(env, "https");
    mtls = await Daemon.start({ ...env, EVENTBUS__SERVER__TLS__CLIENT_CA_FILE: join(dir, "ca.crt") }, "https");
  });
  after(async () => {
    await daemon?.stop();
    await mtls?.stop();
  });

  it("with the CA and the token, calls, subscriptions and workers work", T, async () => {
    const name = uniqueName();
    const client = await Client.connect(daemon.url, { token, tls: { ca: join(dir, "ca.crt") } });
    try {
      const sub = client.subscribe(name);
      await sub.started();
      assert.ok((await client.publish(name, "x")).eventId);
      const [ev] = (await take(sub, 1)) as Event[];
      assert.equal(ev!.payload.toString(), "x");
      await sub.close();
      const info = await client.createConsumer(name, [name]);
      assert.equal(info.owner, "tester");
      const worker = new Worker(client, name, () => {});
      await worker.start();
      assert.equal(worker.info?.owner, "tester");
      await worker.stop();
    } finally {
      client.close();
    }
  });

  for (const bad of [undefined, "wrong-token"]) {
    it(`${bad ? "a wrong" : "no"} token: Unauthenticated everywhere`, T, async () => {
      const name = uniqueName();
      // The CA as PEM text this time (a path works as well).
      const ca = readFileSync(join(dir, "ca.crt"), "utf8");
      const client = await Client.connect(daemon.url, { token: bad, tls: { ca } });
      try {
        await assert.rejects(client.publish(name, "x"), Unauthenticated);
        await assert.rejects(
          (async () => {
            for await (const _ of client.subscribe(name)) break;
          })(),
          Unauthenticated,
        );
        await assert.rejects(new Worker(client, name, () => {}).start(), Unauthenticated);
      } finally {
        client.close();
      }
    });
  }

  it("TLS is required and the server certificate checked", T, async () => {
    const plain = daemon.url.replace("https://", "http://");
    await assert.rejects(Client.connect(plain, { token, connectTimeoutMs: 500 }), Unavailable);
    // The system roots do not know the test CA.
    await assert.rejects(Client.connect(daemon.url, { token, connectTimeoutMs: 500 }), Unavailable);
  });

  it("mutual TLS: the client certificate alone identifies the principal", T, async () => {
    const name = uniqueName();
    const tls = { ca: join(dir, "ca.crt"), cert: join(dir, "client.crt"), key: join(dir, "client.key") };
    const client = await Client.connect(mtls.url, { tls });
    try {
      assert.equal((await client.createConsumer(name, [name])).owner, "admin");
    } finally {
      client.close();
    }
    // Without a client certificate the handshake fails.
    await assert.rejects(
      (async () => {
        const anonymous = await Client.connect(mtls.url, { token, tls: { ca: tls.ca }, connectTimeoutMs: 500 });
        try {
          await anonymous.stats();
        } finally {
          anonymous.close();
        }
      })(),
      Unavailable,
    );
  });
});
