"""`builder bump`: a new upstream release turned into a candidate stack (pins, compatibility, patch
verdicts, report), written next to the stack it starts from and never over it."""
