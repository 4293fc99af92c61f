/**
 * A promise of a @platformatic/kafka call made in its callback form. The library's promise
 * form builds its promises with `Promise.withResolvers`, which Node 20 lacks; its callback
 * form does not, so this client only ever calls that one.
 */
export function viaCallback<T>(start: (callback: (error: Error | null, value?: T) => void) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    start((error, value) => {
      if (error) {
        reject(error);
      } else {
        resolve(value as T);
      }
    });
  });
}
