//! kstatus
