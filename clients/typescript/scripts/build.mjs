// Compiles src/ (with the generated src/gen/) twice: ESM into dist/esm and CommonJS into
// dist/cjs (marked `"type": "commonjs"`), the two halves of package.json's `exports`.
import { spawnSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
rmSync(join(root, "dist"), { recursive: true, force: true });
for (const project of ["tsconfig.json", "tsconfig.cjs.json"]) {
  const result = spawnSync(process.execPath, [tsc, "-p", join(root, project)], { cwd: root, stdio: "inherit" });
  if (result.status !== 0) {
    console.error(`build: tsc -p ${project} failed`);
    process.exit(result.status ?? 1);
  }
}
mkdirSync(join(root, "dist", "cjs"), { recursive: true });
writeFileSync(join(root, "dist", "cjs", "package.json"), '{\n  "type": "commonjs"\n}\n');
