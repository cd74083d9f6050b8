// Generates src/gen/ (TypeScript messages and grpc-js services) from the repository's
// proto/eventbus/v1/eventbus.proto with buf and ts-proto (buf.gen.yaml). Run by
// `npm run build`; the output is gitignored.
import { spawnSync } from "node:child_process";
import { existsSync, rmSync } from "node:fs";
import { delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const proto = resolve(process.env.EVENTBUS_PROTO_DIR ?? join(root, "..", "..", "proto"));
if (!existsSync(join(proto, "eventbus", "v1", "eventbus.proto"))) {
  console.error(`generate: no eventbus/v1/eventbus.proto under ${proto} (set EVENTBUS_PROTO_DIR)`);
  process.exit(1);
}
const bin = join(root, "node_modules", ".bin");
rmSync(join(root, "src", "gen"), { recursive: true, force: true });
const result = spawnSync(join(bin, "buf"), ["generate", proto, "--template", join(root, "buf.gen.yaml")], {
  cwd: root,
  stdio: "inherit",
  env: { ...process.env, PATH: `${bin}${delimiter}${process.env.PATH ?? ""}` },
});
if (result.error) {
  console.error(`generate: cannot run buf: ${result.error.message} (run npm ci first)`);
  process.exit(1);
}
process.exit(result.status ?? 1);
