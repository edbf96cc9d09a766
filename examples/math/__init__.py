"""The example task of the README's "Your own task": word problems, a custom reward."""
