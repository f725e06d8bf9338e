"""Entry points under verl's ``verl.experimental`` names, so that verl's commands start unchanged."""
