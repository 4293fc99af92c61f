/** Where the tests find the repository and the shared vectors. */

import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** This package's directory (the tests run from `dist/test`). */
export const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
/** The Airlock repository around it, when the package sits in one. */
export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));

export const VECTORS_PATH = process.env["AIRLOCK_VECTORS"] ?? `${REPO}schemas/vectors/client.json`;

export function inRepository(): boolean {
  return existsSync(`${REPO}schemas/avro/history`);
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Vectors = any;

export function vectors(): Vectors {
  return JSON.parse(readFileSync(VECTORS_PATH, "utf8"));
}
