// The README's examples, run as written: every ```ts block of README.md is one of
// examples/*.ts (compiled with the tests against the package's own types), and each runs
// against a daemon of its own. The guide's TypeScript blocks (docs/clients.md) must be
// among them.
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";

import { Daemon, PACKAGE_DIR, REPO, tempDir, within } from "./helpers.js";

const T = { timeout: 60_000 };
const README = readFileSync(join(PACKAGE_DIR, "README.md"), "utf8");

function blocks(text: string, lang: string): string[] {
  return [...text.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]!);
}

function example(name: string): string {
  return readFileSync(join(PACKAGE_DIR, "examples", `${name}.ts`), "utf8");
}

function run(name: string, daemon: Daemon): ChildProcess {
  return spawn(process.execPath, [join(PACKAGE_DIR, "build", "examples", `${name}.js`)], {
    cwd: PACKAGE_DIR,
    env: { ...process.env, EVENTBUS_URL: daemon.url },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

async function output(proc: ChildProcess): Promise<string> {
  let out = "";
  let err = "";
  proc.stdout!.on("data", (c: Buffer) => (out += c.toString()));
  proc.stderr!.on("data", (c: Buffer) => (err += c.toString()));
  const code = await within(
    new Promise<number | null>((resolve) => proc.once("close", (c) => resolve(c))),
    30_000,
    "the example to end",
  );
  assert.equal(code, 0, `exit ${code}:\n${out}\n${err}`);
  return out;
}

describe("README", () => {
  it("shows every example, as written in examples/", () => {
    const files = readdirSync(join(PACKAGE_DIR, "examples"))
      .filter((f) => f.endsWith(".ts"))
      .map((f) => f.slice(0, -3))
      .sort();
    const shown = blocks(README, "ts");
    assert.deepEqual(
      shown.map((b) => files.find((f) => example(f) === b) ?? `(not an example file:)\n${b}`).sort(),
      files,
    );
  });

  it("the guide shows only examples run here", () => {
    const guide = readFileSync(join(REPO, "docs", "clients.md"), "utf8");
    const shown = blocks(guide, "ts");
    assert.ok(shown.length > 0, "the guide's clients page shows a TypeScript example");
    for (const block of shown) assert.ok(blocks(README, "ts").includes(block), `not a tested example:\n${block}`);
  });

  describe("examples", () => {
    let daemon: Daemon;
    before(async () => {
      daemon = await Daemon.start();
    });
    after(async () => {
      await daemon?.stop();
    });

    it("publish", T, async () => {
      assert.match(await output(run("publish", daemon)), /^published [0-9a-f-]{36}\n$/);
    });

    it("subscribe", T, async () => {
      assert.equal(await output(run("subscribe", daemon)), "received orders.shipped parcel 7\n");
    });

    it("worker, stopped by SIGTERM", T, async () => {
      const proc = run("worker", daemon);
      const lines = createInterface({ input: proc.stdout! });
      const seen: string[] = [];
      let stderr = "";
      proc.stderr!.on("data", (c: Buffer) => (stderr += c.toString()));
      const closed = new Promise<number | null>((resolve) => proc.once("close", (c) => resolve(c)));
      await within(
        new Promise<void>((resolve) =>
          lines.on("line", (line) => {
            seen.push(line);
            if (line.startsWith("billing order")) resolve();
          }),
        ),
        30_000,
        `the worker's first line (stderr: ${stderr})`,
      );
      assert.equal(seen[0], "billing order 42 attempt 1");
      proc.kill("SIGTERM");
      assert.equal(await within(closed, 30_000, "the worker to stop"), 0, stderr);
      assert.match(seen.at(-1)!, /^stopped: \{ processed: 1, failed: 0, retried: 0, terminated: 0, inFlight: 0 \}$/);
    });
  });

  it("recovery, against a daemon with the README's history rule", T, async () => {
    const [config] = blocks(README, "yaml");
    const dir = tempDir("readme");
    writeFileSync(join(dir, "history.yaml"), config!);
    const daemon = new Daemon({ EVENTBUS_CONFIG: join(dir, "history.yaml") }, "http", dir);
    await daemon.start();
    try {
      assert.equal(await output(run("recovery", daemon)), "received 1.08\nrecovered 1.09 at offset 2 complete: true\n");
    } finally {
      await daemon.stop();
    }
  });
});
