/** Strict UTF-8: the bytes of a string, refusing lone surrogates (which have no UTF-8 form)
 * instead of replacing them, as Python's and Rust's encoders do. */

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

export function utf8(text: string, what = "text"): Buffer {
  if (LONE_SURROGATE.test(text)) {
    throw new TypeError(`${what} has a lone surrogate: it has no UTF-8 form`);
  }
  return Buffer.from(text, "utf8");
}
