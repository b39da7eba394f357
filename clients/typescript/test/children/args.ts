/** `--name value` command-line arguments of the tests' child programs. */

/** The value of `--name`, or `fallback` (an error when neither is there). */
export function arg(name: string, fallback?: string): string {
  const i = process.argv.indexOf(`--${name}`);
  const value = i >= 0 ? process.argv[i + 1] : fallback;
  if (value === undefined) throw new Error(`missing --${name}`);
  return value;
}

/** Keeps the process alive until it is killed (a pending promise alone does not). */
export function hangUntilKilled(): Promise<never> {
  setInterval(() => undefined, 1 << 30);
  return new Promise<never>(() => undefined);
}
