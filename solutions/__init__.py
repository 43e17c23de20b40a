"""Reference solutions of the workshop's exercises: same module names and public API as exercises/."""
