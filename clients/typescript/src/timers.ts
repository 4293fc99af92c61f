/**
 * Timers for the client's waits. Node's `setTimeout` takes at most 2^31-1 ms (about 24.8
 * days) and fires after 1 ms for anything longer (or for `Infinity`), so a long wait is a chain
 * of shorter timers; `Infinity` is a wait without limit.
 */

/** The longest delay `setTimeout` honours. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Calls `fire` once `ms` have passed (never for `Infinity`; at once, on a later turn of the
 * event loop, for 0, a negative delay or NaN); the function returned cancels it. `chunkMs` is
 * the longest single timer of the chain (tests shorten it).
 */
export function timer(ms: number, fire: () => void, chunkMs: number = MAX_TIMER_MS): () => void {
  const start = performance.now();
  let handle: NodeJS.Timeout | undefined;
  const arm = (): void => {
    const left = ms - (performance.now() - start);
    if (left > chunkMs) {
      handle = setTimeout(arm, chunkMs);
    } else {
      handle = setTimeout(fire, left > 0 ? left : 0);
    }
  };
  arm();
  return () => clearTimeout(handle);
}

/** `promise`, or `onTimeout()` thrown when it has not settled within `ms` (no limit for
 * `Infinity`). */
export async function within<T>(promise: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let cancel: () => void = () => undefined;
  const expired = new Promise<never>((_, reject) => {
    cancel = timer(ms, () => reject(onTimeout()));
  });
  try {
    return await Promise.race([promise, expired]);
  } finally {
    cancel();
  }
}

/** Resolves after `ms`, or at once when `signal` is aborted; leaves no listener on `signal`
 * behind. */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    let cancel: () => void = () => undefined;
    const done = (): void => {
      cancel();
      signal?.removeEventListener("abort", done);
      resolve();
    };
    cancel = timer(ms, done);
    signal?.addEventListener("abort", done, { once: true });
  });
}
